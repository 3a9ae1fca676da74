import { mkdtemp, readFile, rm } from "node:fs/promises"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type RunningProcess, startExecutor } from "../support/executors.js"
import {
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

/**
 * Bad input from a client or an app, against the real binary: each is answered 4xx at once with a
 * short `{ error: { code, message } }` that says what is wrong, and changes nothing.
 */

const adminToken = "bad-inputs-admin-token"
const gated = join(repoRoot, "test", "fixtures", "apps", "gated.ts")

interface ErrorAnswer {
  readonly error: { readonly code: string; readonly message: string }
}

/** The error a JSON error answer carries, after checking that it is one and that it is short. */
const errorOf = (answer: { readonly contentType: string; readonly text: string }): ErrorAnswer["error"] => {
  expect(answer.contentType).toContain("application/json")
  expect(answer.text.length).toBeLessThan(4_096)
  return (JSON.parse(answer.text) as ErrorAnswer).error
}

const appIds = async (url: string) =>
  ((await (await fetch(`${url}/app/list`)).json()) as { apps: Array<{ id: string }> }).apps.map((app) => app.id).sort()

/** The data of each Server-Sent Event named `event` in `text`. */
const sseData = (text: string, event: string): Array<Record<string, unknown>> =>
  text
    .split("\n\n")
    .filter((block) => block.startsWith(`event: ${event}\n`))
    .map((block) => JSON.parse(block.slice(block.indexOf("data: ") + "data: ".length)) as Record<string, unknown>)

const llmApp = (model: string) => `
import { ChatCompletionRequest, defineApp, LLMTask } from "cornserve/app"
const llm = new LLMTask({ model: ${JSON.stringify(model)} })
export default defineApp({
  tasks: { llm },
  request: ChatCompletionRequest,
  serve: (request) => llm.invoke(request as never)
})
`

describe("bad input to cornserve serve: a clear 4xx, nothing changed", () => {
  let platform: RunningPlatform
  let modelDir: string
  let gatedSource: string
  let helloSource: string

  const register = (body: unknown) => registerRaw(platform.url, body, adminToken)

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-bad-inputs-models-"))
    platform = await startPlatform({
      args: ["--devices", "cpu:0"],
      env: { CORNSERVE_ADMIN_TOKEN: adminToken, CORNSERVE_MODEL_DIR: modelDir }
    })
    gatedSource = await readFile(gated, "utf8")
    helloSource = await readFile(join(repoRoot, "examples", "hello.ts"), "utf8")
    expect((await register({ name: "hello", source: helloSource })).text).toContain("event: final")
  })

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(modelDir, { recursive: true, force: true })
  })

  describe("admission settings past their bounds", () => {
    it.each([
      ["queueTimeoutMs", 2 ** 31],
      ["queueTimeoutMs", 86_400_001],
      ["maxConcurrency", 1e9],
      ["maxQueue", 2 ** 40]
    ])("refuses a registration that sets %s to %d (400, naming it)", async (field, value) => {
      const before = await appIds(platform.url)
      const refused = await register({ name: "gated_over", source: gatedSource, admission: { [field]: value } })
      expect(refused.status).toBe(400)
      const error = errorOf(refused)
      expect(error.code).toBe("BadRequest")
      expect(error.message).toContain(field)
      expect(await appIds(platform.url)).toEqual(before)
    })

    it("refuses an app whose own admission sets queueTimeoutMs to 2^31 (400, naming it and its bounds)", async () => {
      const before = await appIds(platform.url)
      const source = gatedSource.replace("queueTimeoutMs: 60_000", `queueTimeoutMs: ${2 ** 31}`)
      expect(source).not.toBe(gatedSource)
      const refused = await register({ name: "gated_own", source })
      expect(refused.status).toBe(400)
      const error = errorOf(refused)
      expect(error.code).toBe("InvalidApp")
      expect(error.message).toContain("admission.queueTimeoutMs")
      expect(error.message).toContain("from 1 to 86400000")
      expect(await appIds(platform.url)).toEqual(before)
    })

    it("keeps a queued request waiting under the longest queue timeout allowed, rather than refusing it at once", async () => {
      const registered = await register({
        name: "gated_day",
        source: gatedSource,
        admission: { queueTimeoutMs: 86_400_000 }
      })
      expect(registered.text).toContain("event: final")
      const first = invoke(platform.url, "gated_day", JSON.stringify({ holdMs: 1_500 }))
      // Until the first request runs, a second one would run at once rather than queue.
      for (let tries = 0; tries < 200; tries++) {
        const { apps } = (await (await fetch(`${platform.url}/app/list`)).json()) as {
          apps: Array<{ id: string; inFlight: number }>
        }
        if (apps.find((app) => app.id === "gated_day")?.inFlight === 1) break
        await new Promise((resolve) => setTimeout(resolve, 25))
      }
      const queued = await invoke(platform.url, "gated_day", JSON.stringify({ holdMs: 0 }))
      expect(queued.status).toBe(200)
      expect(await queued.json()).toEqual({ held: 0 })
      expect((await first).status).toBe(200)
    })
  })

  describe("a profile recording's levels", () => {
    const record = (body: unknown) =>
      fetch(`${platform.url}/tasks/no-such-task/profile/record`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${adminToken}` },
        body: JSON.stringify(body)
      })

    it("refuses 200,000 levels with a 400 and a short message, before anything else", async () => {
      const response = await record({ levels: Array.from({ length: 200_000 }, () => 1) })
      expect(response.status).toBe(400)
      const error = errorOf({ contentType: response.headers.get("content-type") ?? "", text: await response.text() })
      expect(error.code).toBe("BadRequest")
      expect(error.message).toContain("from 1 to 64 levels, not 200000")
    })

    it("refuses 65 levels, and a level out of range, with a 400", async () => {
      for (const levels of [Array.from({ length: 65 }, (_, index) => index + 1), [0], [2_000], []]) {
        const response = await record({ levels })
        expect(response.status, JSON.stringify(levels)).toBe(400)
        expect(((await response.json()) as ErrorAnswer).error.code).toBe("BadRequest")
      }
    })

    it("takes 64 levels as far as the task: an unknown one is 404", async () => {
      const response = await record({ levels: Array.from({ length: 64 }, (_, index) => index + 1) })
      expect(response.status).toBe(404)
      expect(((await response.json()) as ErrorAnswer).error.code).toBe("TaskNotFound")
    })
  })

  describe("a task's model named by a path outside the allowed model directories", () => {
    /** What the registration of an app whose task's model is `model` fails with, its model replaced by MODEL. */
    const failure = async (name: string, model: string) => {
      const answer = await register({ name, source: llmApp(model) })
      const errors = [...sseData(answer.text, "error")]
      if (answer.status >= 400) errors.push((JSON.parse(answer.text) as ErrorAnswer).error)
      expect(errors, answer.text).toHaveLength(1)
      const error = (errors[0]!.error ?? errors[0]) as ErrorAnswer["error"]
      // The task's id is derived from its model: it differs, as the path does.
      return error.message.replaceAll(model, "MODEL").replace(/llm-[0-9a-f]+/g, "TASK")
    }

    it("refuses it with one message whether the path is a directory, a file or nothing", async () => {
      const before = await appIds(platform.url)
      const messages = [
        await failure("model_dir", "/etc"),
        await failure("model_file", "/etc/passwd"),
        await failure("model_missing", "/no/such/directory/at/all"),
        await failure("model_escape", join(modelDir, "..", "..", "etc"))
      ]
      expect(new Set(messages).size, messages.join("\n")).toBe(1)
      // On one machine the refusal is the registration's own answer, before anything is deployed.
      expect((await register({ name: "model_dir_again", source: llmApp("/etc") })).status).toBe(400)
      expect(messages[0]).toContain("not a model directory this node allows")
      expect(messages[0]).not.toMatch(/exists|no such|config\.json|ENOENT|ENOTDIR/)
      expect(await appIds(platform.url)).toEqual(before)
    })
  })

  describe("invoke routes take JSON only", () => {
    const post = (path: string, headers: Record<string, string>, body: string) =>
      fetch(`${platform.url}${path}`, { method: "POST", headers, body })

    it.each([
      ["text/plain", { "content-type": "text/plain" }],
      ["a form", { "content-type": "application/x-www-form-urlencoded" }],
      ["multipart", { "content-type": "multipart/form-data; boundary=x" }],
      ["no content-type", {}],
      ["JSON in another charset", { "content-type": "application/json; charset=utf-16" }]
    ])("refuses %s with 415 and says what to send", async (_, headers: Record<string, string>) => {
      const metricsBefore = await (await fetch(`${platform.url}/metrics`)).text()
      for (const path of ["/app/invoke/hello", "/app/hello/v1/chat/completions"]) {
        // fetch adds text/plain to a string body unless told otherwise; a Blob with no type adds none.
        const body = "content-type" in headers ? '{"name":"Ada"}' : new Blob(['{"name":"Ada"}'])
        const response = await fetch(`${platform.url}${path}`, { method: "POST", headers, body })
        expect(response.status, path).toBe(415)
        const error = errorOf({ contentType: response.headers.get("content-type") ?? "", text: await response.text() })
        expect(error.code).toBe("UnsupportedMediaType")
        expect(error.message).toContain("content-type: application/json")
      }
      // The app never ran: no request of it answered 200 since.
      const ran = (text: string) =>
        /cornserve_request_duration_seconds_count\{app="hello",status="200"\} (\d+)/.exec(text)?.[1]
      expect(ran(await (await fetch(`${platform.url}/metrics`)).text())).toBe(ran(metricsBefore))
    })

    it("takes application/json, with or without a UTF-8 charset", async () => {
      for (const contentType of [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8"
      ]) {
        const response = await post("/app/invoke/hello", { "content-type": contentType }, '{"name":"Ada"}')
        expect(response.status, contentType).toBe(200)
        expect(((await response.json()) as { greeting: string }).greeting).toContain("Ada")
      }
    })
  })
})

describe("a media URL that redirects to another scheme, against a real encoder", () => {
  const secret = "bad-inputs-internal-secret"
  let root: string
  let server: Http.Server
  let base: string
  let encoder: RunningProcess & { readonly url: string }

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-bad-inputs-media-"))
    server = Http.createServer((request, response) => {
      const location = {
        "/to-file": "file:///etc/passwd",
        "/to-data": "data:image/png;base64,iVBORw0KGgo=",
        "/to-ftp": "ftp://127.0.0.1/a.png"
      }[request.url ?? ""]
      if (location === undefined) response.writeHead(404).end()
      else response.writeHead(302, { location }).end()
    })
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    // A server on this machine: the encoder must be allowed private hosts to fetch from it at all.
    encoder = await startExecutor(
      ["--kind", "eric", "--model", "cornserve/tiny-color-vlm", "--devices", "cpu:0", "--allow-private-hosts"],
      { CORNSERVE_MODEL_DIR: join(root, "models"), CORNSERVE_INTERNAL_SECRET: secret }
    )
  })

  afterAll(async () => {
    await encoder?.stop()
    server?.closeAllConnections()
    server?.close()
    await rm(root, { recursive: true, force: true })
  })

  it.each([
    ["file:", "/to-file"],
    ["data:", "/to-data"],
    ["ftp:", "/to-ftp"]
  ])("answers 400 MediaError saying it does not follow a redirect to %s", async (scheme, path) => {
    const response = await fetch(`${encoder.url}/embeddings`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${secret}` },
      body: JSON.stringify({
        items: [{ id: "redirected", modality: "image", url: `${base}${path}` }],
        return: "inline"
      })
    })
    expect(response.status).toBe(400)
    const error = errorOf({ contentType: response.headers.get("content-type") ?? "", text: await response.text() })
    expect(error.code).toBe("MediaError")
    expect(error.message).toContain(`${base}${path} redirects to a ${scheme} URL`)
    expect(error.message).toContain("only redirects to http: and https: are followed")
    // The encoder still serves.
    expect((await fetch(`${encoder.url}/health`)).status).toBe(200)
  })
})
