import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  appState,
  childPids,
  eventually,
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  isAlive,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const token = "test-admin-token"

const fixture = (name: string) => join(repoRoot, "test", "fixtures", "apps", `${name}.ts`)
const example = (name: string) => join(repoRoot, "examples", `${name}.ts`)

describe("cornserve serve: apps registered at run time and invoked over HTTP", () => {
  let platform: RunningPlatform
  let cliEnv: Record<string, string>

  beforeAll(async () => {
    platform = await startPlatform({
      // One GPU, which only one executor may hold (its executors never start here: nothing places a second).
      args: ["--request-timeout", "2", "--max-body-bytes", "65536", "--devices", "cuda:0"],
      env: { CORNSERVE_ADMIN_TOKEN: token }
    })
    cliEnv = { CORNSERVE_GATEWAY_URL: platform.url, CORNSERVE_ADMIN_TOKEN: token }
  })

  afterAll(async () => {
    await platform.stop()
    await removeStateDir(platform.stateDir)
  })

  it("registers hello and countdown with the CLI", async () => {
    for (const name of ["hello", "countdown"]) {
      const result = await runCli(["app", "register", example(name)], cliEnv)
      expect(result.stderr).toContain("loaded")
      expect(result.stdout).toContain(`app ${name} is ready`)
      expect(result.code).toBe(0)
    }
    const list = await runCli(["app", "list"], cliEnv)
    expect(list.stdout).toMatch(/countdown\s+ready/)
    expect(list.stdout).toMatch(/hello\s+ready/)
  })

  it("answers hello with a greeting that contains the name", async () => {
    const response = await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))
    expect(response.status).toBe(200)
    expect(response.headers.get("content-type")).toContain("application/json")
    const body = (await response.json()) as { greeting: string }
    expect(body.greeting).toContain("Ada")

    const cli = await runCli(["app", "invoke", "hello", "--data", '{"name":"Grace"}'], cliEnv)
    expect(cli.code).toBe(0)
    expect(JSON.parse(cli.stdout).greeting).toContain("Grace")
  })

  it("takes --data from a file and from standard input", async () => {
    const fromStdin = await runCli(["app", "invoke", "hello", "--data", "-"], cliEnv, '{"name":"Stdin"}')
    expect(JSON.parse(fromStdin.stdout).greeting).toContain("Stdin")
    const dir = await mkdtemp(join(tmpdir(), "cornserve-data-"))
    await writeFile(join(dir, "request.json"), '{"name":"File"}')
    const fromFile = await runCli(["app", "invoke", "hello", "--data", `@${join(dir, "request.json")}`], cliEnv)
    expect(JSON.parse(fromFile.stdout).greeting).toContain("File")
    await rm(dir, { recursive: true })
  })

  it("streams countdown lines one by one, before the stream ends", async () => {
    const response = await invoke(platform.url, "countdown", JSON.stringify({ from: 3, intervalMs: 400 }))
    expect(response.status).toBe(200)
    expect(response.headers.get("content-type")).toContain("application/x-ndjson")
    const reader = response.body!.getReader()
    const decoder = new TextDecoder()
    let text = ""
    const first = await reader.read()
    text += decoder.decode(first.value)
    // The first line is here while the response is still open: the answer is not buffered to the end.
    expect(first.done).toBe(false)
    expect(text.trim().split("\n")).toHaveLength(1)
    expect(JSON.parse(text.trim())).toEqual({ count: 3, done: false })
    for (;;) {
      const next = await reader.read()
      if (next.done) break
      text += decoder.decode(next.value)
    }
    expect(
      text
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line))
    ).toEqual([
      { count: 3, done: false },
      { count: 2, done: false },
      { count: 1, done: true }
    ])
  })

  it("prints streamed lines with the CLI, or one field concatenated with --aggregate", async () => {
    const lines = await runCli(["app", "invoke", "countdown", "--data", '{"from":3,"intervalMs":10}'], cliEnv)
    expect(lines.code).toBe(0)
    expect(lines.stdout.trim().split("\n")).toHaveLength(3)
    const aggregated = await runCli(
      ["app", "invoke", "countdown", "--data", '{"from":3,"intervalMs":10}', "--aggregate", "count"],
      cliEnv
    )
    expect(aggregated.stdout.trim()).toBe("321")
  })

  describe("bad input: a clear JSON error, and the gateway keeps serving", () => {
    const errorOf = async (response: Response) =>
      ((await response.json()) as { error: { code: string; message: string; module?: string } }).error

    it("refuses app source with a syntax error (400, with line and column)", async () => {
      const source = 'import { defineApp } from "cornserve/app"\nexport default defineApp({\n  tasks: {,\n})\n'
      const result = await registerRaw(platform.url, { name: "broken", source }, token)
      expect(result.status).toBe(400)
      const { error } = JSON.parse(result.text)
      expect(error.code).toBe("AppSyntaxError")
      expect(error.message).toMatch(/broken\.ts:3:11:/)
    })

    it("refuses a name the gateway's own routes use, and one that is not a name (400)", async () => {
      const source = await readFile(example("hello"), "utf8")
      const logs = await registerRaw(platform.url, { name: "logs", source }, token)
      expect(logs.status).toBe(400)
      expect(JSON.parse(logs.text).error).toMatchObject({ code: "InvalidAppName" })
      expect(JSON.parse(logs.text).error.message).toContain("the gateway's own routes use it (/app/logs/...)")
      const dotted = await registerRaw(platform.url, { name: "a.b", source }, token)
      expect(dotted.status).toBe(400)
      expect(JSON.parse(dotted.text).error.message).toContain("use 1 to 63 letters")
    })

    it("refuses an app without a default export, or without serve (400)", async () => {
      const noDefault = await registerRaw(platform.url, { name: "nodefault", source: "export const x = 1\n" }, token)
      expect(noDefault.status).toBe(400)
      expect(JSON.parse(noDefault.text).error.message).toContain("no default export")

      const noServe = await runCli(["app", "register", fixture("no_serve")], cliEnv)
      expect(noServe.code).not.toBe(0)
      expect(noServe.stderr).toContain("`serve` must be a function")
    })

    it("refuses a forbidden import and names the module (400)", async () => {
      const source =
        'import leftPad from "left-pad"\nimport { defineApp } from "cornserve/app"\nimport { Schema } from "effect"\nexport default defineApp({ tasks: {}, request: Schema.Struct({}), serve: () => leftPad("x", 3) })\n'
      const result = await registerRaw(platform.url, { name: "sneaky", source }, token)
      expect(result.status).toBe(400)
      const { error } = JSON.parse(result.text)
      expect(error.code).toBe("ForbiddenImport")
      expect(error.module).toBe("left-pad")
      expect(error.message).toContain('"left-pad"')

      const missingSubpath =
        'import { Nope } from "effect/Nope"\nimport { defineApp } from "cornserve/app"\nimport { Schema } from "effect"\nexport default defineApp({ tasks: {}, request: Schema.Struct({}), serve: () => Nope })\n'
      const refused = JSON.parse(
        (await registerRaw(platform.url, { name: "subpath", source: missingSubpath }, token)).text
      )
      expect(refused.error.code).toBe("ForbiddenImport")
      expect(refused.error.message).toContain('"effect/Nope" is not a module of effect')
      expect(refused.error.message).not.toContain("node_modules")
    })

    it("answers 500 for a serve that throws, for that request only", async () => {
      expect((await runCli(["app", "register", fixture("flaky")], cliEnv)).code).toBe(0)
      const failed = await invoke(platform.url, "flaky", JSON.stringify({ fail: true }))
      expect(failed.status).toBe(500)
      const error = await errorOf(failed)
      expect(error.code).toBe("AppFailed")
      expect(error.message).toContain("the app was asked to fail")
      const next = await invoke(platform.url, "flaky", JSON.stringify({ fail: false }))
      expect(next.status).toBe(200)
      expect(await next.json()).toEqual({ ok: true })
      expect(await appState(platform.url, "flaky")).toBe("ready")
    })

    it("answers 504 when serve never returns", async () => {
      expect((await runCli(["app", "register", fixture("stuck")], cliEnv)).code).toBe(0)
      const response = await invoke(platform.url, "stuck", "{}")
      expect(response.status).toBe(504)
      expect((await errorOf(response)).code).toBe("RequestTimeout")
    })

    it("answers 400 for a body that is not JSON", async () => {
      const response = await invoke(platform.url, "hello", "{name: Ada")
      expect(response.status).toBe(400)
      expect((await errorOf(response)).message).toContain("not JSON")
    })

    it("answers 422 for a request that fails the app's schema, naming the field", async () => {
      const response = await invoke(platform.url, "hello", JSON.stringify({ name: 42 }))
      expect(response.status).toBe(422)
      const error = await errorOf(response)
      expect(error.code).toBe("RequestSchemaMismatch")
      expect(error.message).toContain("name")
    })

    it("answers 413 for a body over the limit", async () => {
      const response = await invoke(platform.url, "hello", JSON.stringify({ name: "x".repeat(100_000) }))
      expect(response.status).toBe(413)
      expect((await errorOf(response)).code).toBe("PayloadTooLarge")
    })

    it("answers 404 for an unknown app", async () => {
      const response = await invoke(platform.url, "nobody", "{}")
      expect(response.status).toBe(404)
      expect((await errorOf(response)).code).toBe("AppNotFound")
      const cli = await runCli(["app", "invoke", "nobody", "--data", "{}"], cliEnv)
      expect(cli.code).not.toBe(0)
      expect(cli.stderr).toContain('no app named "nobody"')
    })

    it("answers 400 for an app id that is not valid percent-encoding, and keeps serving", async () => {
      for (const path of ["/app/invoke/%E0%A4%A", "/app/%E0%A4%A/v1/chat/completions"]) {
        const response = await fetch(`${platform.url}${path}`, { method: "POST", body: "{}" })
        expect(response.status).toBe(400)
        expect((await errorOf(response)).code).toBe("BadRequest")
      }
      expect((await fetch(`${platform.url}/health`)).status).toBe(200)
    })

    it("answers 409 for a taken name", async () => {
      const source = await readFile(example("hello"), "utf8")
      const result = await registerRaw(platform.url, { name: "hello", source }, token)
      expect(result.status).toBe(409)
      expect(JSON.parse(result.text).error.code).toBe("AppNameTaken")
      const cli = await runCli(["app", "register", example("hello")], cliEnv)
      expect(cli.code).not.toBe(0)
      expect(cli.stderr).toContain("--replace")
    })

    it("answers 401 for a missing or wrong admin token", async () => {
      const source = await readFile(example("hello"), "utf8")
      const missing = await registerRaw(platform.url, { name: "hello3", source }, null)
      expect(missing.status).toBe(401)
      const wrong = await registerRaw(platform.url, { name: "hello3", source }, "not-the-token")
      expect(wrong.status).toBe(401)
      const unregister = await fetch(`${platform.url}/app/unregister/hello`, { method: "POST" })
      expect(unregister.status).toBe(401)
      const cli = await runCli(["app", "unregister", "hello"], {
        CORNSERVE_GATEWAY_URL: platform.url,
        CORNSERVE_ADMIN_TOKEN: ""
      })
      expect(cli.code).not.toBe(0)
      expect(await appState(platform.url, "hello")).toBe("ready")
    })

    it("fails to register an app whose tasks cannot all deploy, with a clear error, and rolls back", async () => {
      // color_chat needs three executors (two encoders and an LLM); this platform has one GPU, never shared.
      const cli = await runCli(["app", "register", example("color_chat")], cliEnv)
      expect(cli.code).not.toBe(0)
      expect(cli.stderr).toMatch(/needs 1 device\(s\) per executor, 1 executor\(s\); free: \S+ 0 of 1/)
      expect(await appState(platform.url, "color_chat")).toBeUndefined()
      const tasks = (await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<unknown> }
      expect(tasks.tasks).toEqual([])
    })

    it("keeps serving after all of the above", async () => {
      expect((await fetch(`${platform.url}/health`)).status).toBe(200)
      const response = await invoke(platform.url, "hello", JSON.stringify({ name: "Still here" }))
      expect(((await response.json()) as { greeting: string }).greeting).toContain("Still here")
    })
  })

  it("swaps an app in with --replace without failing a request in flight", async () => {
    const versioned = (version: number) =>
      `import { Schema } from "effect"\nimport { defineApp } from "cornserve/app"\nimport { setTimeout as sleep } from "node:timers/promises"\n` +
      `export default defineApp({ tasks: {}, request: Schema.Struct({}), serve: async () => { await sleep(800); return { version: ${version} } } })\n`
    expect((await registerRaw(platform.url, { name: "versioned", source: versioned(1) }, token)).status).toBe(200)
    await eventually(async () => ((await appState(platform.url, "versioned")) === "ready" ? true : undefined))
    const inFlight = invoke(platform.url, "versioned", "{}")
    await new Promise((resolve) => setTimeout(resolve, 100))
    const replaced = await registerRaw(platform.url, { name: "versioned", source: versioned(2), replace: true }, token)
    expect(replaced.text).toContain("event: final")
    const old = await inFlight
    expect(old.status).toBe(200)
    expect(await old.json()).toEqual({ version: 1 })
    const fresh = await invoke(platform.url, "versioned", "{}")
    expect(await fresh.json()).toEqual({ version: 2 })
  })

  it("lets a request in flight finish when its app is unregistered", async () => {
    const response = await invoke(platform.url, "countdown", JSON.stringify({ from: 3, intervalMs: 300 }))
    const body = response.text()
    const unregistered = await runCli(["app", "unregister", "countdown"], cliEnv)
    expect(unregistered.code).toBe(0)
    expect(
      (await body)
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line).count)
    ).toEqual([3, 2, 1])
    expect((await invoke(platform.url, "countdown", "{}")).status).toBe(404)
    expect((await runCli(["app", "register", example("countdown")], cliEnv)).code).toBe(0)
  })

  it("unregisters apps with the CLI; they are gone", async () => {
    for (const name of ["hello", "countdown"]) {
      const result = await runCli(["app", "unregister", name], cliEnv)
      expect(result.code).toBe(0)
      expect((await invoke(platform.url, name, "{}")).status).toBe(404)
    }
    const unknown = await runCli(["app", "unregister", "hello"], cliEnv)
    expect(unknown.code).not.toBe(0)
    const list = await runCli(["app", "list"], cliEnv)
    expect(list.stdout).not.toMatch(/^hello\s/m)
  })
})

describe("cornserve serve: restarts and shutdown", () => {
  it("brings registered apps back, ready, after being killed and started again", async () => {
    const first = await startPlatform()
    const env = { CORNSERVE_GATEWAY_URL: first.url }
    expect((await runCli(["app", "register", example("hello")], env)).code).toBe(0)
    expect((await runCli(["app", "register", example("countdown"), "--name", "count"], env)).code).toBe(0)
    await first.kill()

    const second = await startPlatform({ stateDir: first.stateDir })
    try {
      await eventually(async () => ((await appState(second.url, "hello")) === "ready" ? true : undefined))
      await eventually(async () => ((await appState(second.url, "count")) === "ready" ? true : undefined))
      const response = await invoke(second.url, "hello", JSON.stringify({ name: "again" }))
      expect(((await response.json()) as { greeting: string }).greeting).toContain("again")
    } finally {
      await second.stop()
      await removeStateDir(first.stateDir)
    }
  })

  it("lets a request in flight finish on SIGTERM, then exits 0 with no child process left", async () => {
    const platform = await startPlatform()
    try {
      expect(
        (await runCli(["app", "register", example("countdown")], { CORNSERVE_GATEWAY_URL: platform.url })).code
      ).toBe(0)
      const children = childPids(platform.process.pid!)
      expect(children.length).toBeGreaterThan(0)
      const response = await invoke(platform.url, "countdown", JSON.stringify({ from: 4, intervalMs: 300 }))
      const body = response.text()
      const code = platform.stop()
      const lines = (await body).trim().split("\n")
      expect(lines.map((line) => JSON.parse(line).count)).toEqual([4, 3, 2, 1])
      expect(await code).toBe(0)
      expect(children.filter(isAlive)).toEqual([])
    } finally {
      await platform.kill()
      await removeStateDir(platform.stateDir)
    }
  })
})
