import { readFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  adminHeaders,
  appState,
  eventually,
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const fixture = (name: string) => readFileSync(join(repoRoot, "test", "fixtures", "apps", `${name}.ts`), "utf8")
const helloSource = readFileSync(join(repoRoot, "examples", "hello.ts"), "utf8")
const helloAnswer = { greeting: "Hello, Ada! Cornserve is serving you." }

/** The platform's bound on an app's answers, small so that a message over the channel's bound stays light. */
const maxResponseBytes = 1024 * 1024

interface Forgery {
  /** Messages the app writes onto its channel while serving its first request (whose id is 0). */
  readonly messages?: ReadonlyArray<unknown>
  /** Frames' bodies as they are, JSON or not. */
  readonly texts?: ReadonlyArray<string>
  readonly oversizedBytes?: number
  readonly nodeIpc?: boolean
}

/** The error a failed request answered with: its body's, or a stream's last line's. */
const failureOf = async (response: Response) => {
  const text = await response.text()
  const body = response.status === 200 ? text.trim().split("\n").at(-1)! : text
  return { status: response.status, error: (JSON.parse(body) as { error?: { code: string; message: string } }).error }
}

describe("an app's process cannot crash the platform with what it writes on its channel", () => {
  let platform: RunningPlatform
  let registrations = 0

  beforeAll(async () => {
    platform = await startPlatform({
      args: ["--devices", "cpu:0", "--max-response-bytes", String(maxResponseBytes)]
    })
    expect((await registerRaw(platform.url, { name: "hello", source: helloSource })).text).toContain("event: final")
  })

  afterAll(async () => {
    await platform.stop()
    await removeStateDir(platform.stateDir)
  })

  const hello = async () => {
    const response = await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))
    return { status: response.status, body: await response.json() }
  }

  const stillServing = async () => {
    expect(platform.process.exitCode).toBeNull()
    expect((await fetch(`${platform.url}/health`)).status).toBe(200)
    expect(await hello()).toEqual({ status: 200, body: helloAnswer })
  }

  /**
   * Registers a forging app of its own (so its first request is request 0 and its restarts start
   * with the shortest wait), runs `forgery` in its first request beside a well-behaved app's request,
   * and answers how the forging request ended once the app is serving again.
   */
  const attack = async (forgery: Forgery) => {
    const name = `forger_${registrations++}`
    expect((await registerRaw(platform.url, { name, source: fixture("ipc_forger") })).text).toContain("event: final")
    const beside = hello()
    const response = await invoke(
      platform.url,
      name,
      JSON.stringify({
        messages: [...(forgery.messages ?? []).map((message) => JSON.stringify(message)), ...(forgery.texts ?? [])],
        ...(forgery.oversizedBytes === undefined ? {} : { oversizedBytes: forgery.oversizedBytes }),
        ...(forgery.nodeIpc === undefined ? {} : { nodeIpc: forgery.nodeIpc }),
        waitMs: 10_000
      })
    )
    const failure = await failureOf(response)
    expect(await beside).toEqual({ status: 200, body: helloAnswer })
    await stillServing()
    const honest = JSON.stringify({ messages: [], waitMs: 0 })
    await eventually(async () => ((await invoke(platform.url, name, honest)).status === 200 ? true : undefined))
    expect(await appState(platform.url, name)).toBe("ready")
    const unregistered = await fetch(`${platform.url}/app/unregister/${name}`, {
      method: "POST",
      headers: adminHeaders({ "content-type": "application/json" })
    })
    expect(unregistered.status).toBe(200)
    return failure
  }

  const expectBrokeProtocol = (failure: Awaited<ReturnType<typeof attack>>, reason: string) => {
    expect([200, 500, 503]).toContain(failure.status)
    expect(failure.error?.code).toBe("AppFailed")
    expect(failure.error?.message).toContain("broke the protocol")
    expect(failure.error?.message).toContain(reason)
  }

  it("has no Node IPC channel to send on: process.send(null) fails that request only", async () => {
    const failure = await attack({ nodeIpc: true })
    expect(failure.status).toBe(500)
    expect(failure.error?.code).toBe("AppFailed")
    expect(failure.error?.message).toContain("process.send is not a function")
  }, 60_000)

  it.each([
    ["null", [null], "cannot read"],
    ["a message Node would act on itself", [{ cmd: "NODE_HANDLE_ACK" }], "cannot read"],
    ["a value with no field it needs", [{ t: "value", rid: 0, json: null }], "cannot read"]
  ])(
    "stops an app that sends %s, fails its request and keeps serving",
    async (_, messages, reason) => {
      expectBrokeProtocol(await attack({ messages }), reason)
    },
    60_000
  )

  it("stops an app that writes a message that is not JSON", async () => {
    expectBrokeProtocol(await attack({ texts: ['{"t":"value",'] }), "not JSON")
  }, 60_000)

  it("stops an app that nests a message 100,000 deep, before parsing it", async () => {
    const deep = `{"t":"pong","nonce":0,"x":${"[".repeat(100_000)}${"]".repeat(100_000)}}`
    expectBrokeProtocol(await attack({ texts: [deep] }), "nested deeper than the limit of 64")
  }, 60_000)

  it.each([
    ["a value for a request it was never given", [{ t: "value", rid: 999_999, json: "null" }], "never given"],
    [
      "a stream-start twice",
      [
        { t: "stream-start", rid: 0 },
        { t: "stream-start", rid: 0 }
      ],
      "twice"
    ],
    ["a chunk before its stream started", [{ t: "chunk", rid: 0, json: "{}" }], "before starting its stream"],
    [
      "a value after its stream started",
      [
        { t: "stream-start", rid: 0 },
        { t: "value", rid: 0, json: "{}" }
      ],
      "whose stream had started"
    ],
    ["the end of a stream it had not started", [{ t: "end", rid: 0 }], "had not started"],
    ["a second loaded", [{ t: "loaded", tasks: [], example: null }], "after its app had loaded"],
    [
      "a dispatch of a task it did not declare",
      [
        {
          t: "dispatch",
          did: 0,
          requestId: "forged",
          graph: {
            invocations: [
              {
                taskId: "llm-of-another-app",
                kind: "llm",
                operation: "chat",
                config: {},
                input: {},
                output: {},
                streams: false
              }
            ]
          }
        }
      ],
      "does not declare"
    ],
    ["a credit for a dispatch it never made", [{ t: "dispatch-credit", did: 3, chunks: 1 }], "never made"],
    ["a cancel of a dispatch it never made", [{ t: "dispatch-cancel", did: 0 }], "never made"]
  ])(
    "stops an app that sends %s, fails its request and keeps serving",
    async (_, messages, reason) => {
      expectBrokeProtocol(await attack({ messages }), reason)
    },
    60_000
  )

  it("stops an app that sends a message over the bound, by its length, before reading it", async () => {
    const failure = await attack({ oversizedBytes: 8 * maxResponseBytes })
    expectBrokeProtocol(
      failure,
      `a message of ${8 * maxResponseBytes + 2} bytes, over the limit of ${3 * maxResponseBytes} bytes`
    )
  }, 60_000)

  it("refuses at registration an app whose process says it loaded with admission settings out of bounds", async () => {
    const registered = await registerRaw(platform.url, { name: "forger_adm", source: fixture("ipc_forger_admission") })
    expect(registered.status).toBe(400)
    expect(JSON.parse(registered.text).error.message).toContain("admission settings are out of bounds")
    expect(JSON.parse(registered.text).error.message).toContain("queueTimeoutMs")
    expect(await appState(platform.url, "forger_adm")).toBeUndefined()
    await stillServing()
  }, 60_000)

  it("refuses at registration an app whose top-level code forges a message", async () => {
    const registered = await registerRaw(platform.url, { name: "forger_top", source: fixture("ipc_forger_top_level") })
    expect(registered.status).toBe(400)
    expect(JSON.parse(registered.text).error.message).toContain("before its app had loaded")
    await stillServing()
  }, 60_000)
})
