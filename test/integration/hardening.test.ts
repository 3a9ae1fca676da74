import { spawn } from "node:child_process"
import { readFile } from "node:fs/promises"
import { request as httpRequest } from "node:http"
import { connect } from "node:net"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  binPath,
  invoke,
  makeStateDir,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

/** A POST with any headers, Host included (which fetch does not let a caller set). */
const post = (url: string, path: string, headers: Record<string, string>, body: string) =>
  new Promise<{ status: number; text: string }>((resolve, reject) => {
    const target = new URL(path, url)
    const outgoing = httpRequest(
      { host: target.hostname, port: target.port, path: target.pathname, method: "POST", headers },
      (response) => {
        let text = ""
        response.on("data", (chunk: Buffer) => {
          text += chunk.toString()
        })
        response.on("end", () => resolve({ status: response.statusCode ?? 0, text }))
      }
    )
    outgoing.once("error", reject)
    outgoing.end(body)
  })

describe("cornserve serve against cross-site requests, DNS rebinding and oversized input", () => {
  let platform: RunningPlatform
  let source: string

  beforeAll(async () => {
    // No admin token: what keeps a web page from registering code is then the guard alone.
    platform = await startPlatform({
      args: ["--devices", "cpu:0", "--allowed-host", "cornserve.internal", "--insecure-no-auth"],
      env: { CORNSERVE_ADMIN_TOKEN: "" }
    })
    source = await readFile(join(repoRoot, "examples", "hello.ts"), "utf8")
    expect((await registerRaw(platform.url, { name: "hello", source })).text).toContain("event: final")
  })

  afterAll(async () => {
    await platform.stop()
    await removeStateDir(platform.stateDir)
  })

  const registerWith = (headers: Record<string, string>) =>
    post(platform.url, "/app/register", headers, JSON.stringify({ name: "planted", source }))

  it("refuses, with no admin token set, a registration a web page could send: text/plain, a foreign Origin or Host", async () => {
    const host = new URL(platform.url).host
    for (const headers of [
      { host, "content-type": "text/plain" },
      { host, "content-type": "application/x-www-form-urlencoded" },
      { host, "content-type": "application/json", origin: "http://attacker.example" },
      { host: `attacker.example:${new URL(platform.url).port}`, "content-type": "application/json" }
    ]) {
      const refused = await registerWith(headers)
      expect(refused.status, JSON.stringify(headers)).toBe(403)
      expect(JSON.parse(refused.text).error.code).toBe("Forbidden")
    }
    const unregister = await post(platform.url, "/app/unregister/hello", { host, "content-type": "text/plain" }, "")
    expect(unregister.status).toBe(403)
    const apps = (await (await fetch(`${platform.url}/app/list`)).json()) as { apps: Array<{ id: string }> }
    expect(apps.apps.map((app) => app.id)).toEqual(["hello"])
  })

  it("takes a registration under an allowed host name, from its own origin", async () => {
    const port = new URL(platform.url).port
    const accepted = await registerWith({
      host: `cornserve.internal:${port}`,
      origin: `http://cornserve.internal:${port}`,
      "content-type": "application/json"
    })
    expect(accepted.status).toBe(200)
    expect(accepted.text).toContain("event: final")
  })

  it("refuses a body nested past the depth limit with 400, before the app sees it, and keeps the app serving", async () => {
    const deep = `{"name":${"[".repeat(100_000)}${"]".repeat(100_000)}}`
    for (const path of ["/app/invoke/hello", "/app/register", "/task/scale"]) {
      const response = await fetch(`${platform.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: deep
      })
      expect(response.status, path).toBe(400)
      expect(((await response.json()) as { error: { message: string } }).error.message).toContain("deeper than")
    }
    expect((await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))).status).toBe(200)
  })

  it("answers a 422 without echoing a large value back", async () => {
    const huge = "x".repeat(1_000_000)
    const response = await invoke(platform.url, "hello", JSON.stringify({ name: huge }))
    expect(response.status).toBe(422)
    expect((await response.text()).length).toBeLessThan(5_000)
  })
})

/** Writes `text` on a raw connection, then waits for the gateway to close it; resolves with what it answered. */
const holdOpen = (url: string, text: string) =>
  new Promise<string>((resolve, reject) => {
    const target = new URL(url)
    const socket = connect(Number(target.port), target.hostname, () => socket.write(text))
    let answer = ""
    socket.on("data", (chunk: Buffer) => {
      answer += chunk.toString()
    })
    socket.once("error", reject)
    socket.once("close", () => resolve(answer))
  })

describe("cornserve serve bounds slow clients and large answers", () => {
  let platform: RunningPlatform

  beforeAll(async () => {
    platform = await startPlatform({
      args: [
        "--devices",
        "cpu:0",
        "--body-idle-timeout",
        "1",
        "--headers-timeout",
        "2",
        "--max-response-bytes",
        String(1024 * 1024)
      ]
    })
    for (const name of ["hello", "bulky"]) {
      const source = await readFile(
        join(repoRoot, ...(name === "hello" ? ["examples"] : ["test", "fixtures", "apps"]), `${name}.ts`),
        "utf8"
      )
      expect((await registerRaw(platform.url, { name, source })).text).toContain("event: final")
    }
  })

  afterAll(async () => {
    await platform.stop()
    await removeStateDir(platform.stateDir)
  })

  const stillServing = async () =>
    expect((await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))).status).toBe(200)

  it("answers 408 and closes the connection when a request body stalls", async () => {
    const host = new URL(platform.url).host
    const answer = await holdOpen(
      platform.url,
      `POST /app/invoke/hello HTTP/1.1\r\nHost: ${host}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"na`
    )
    expect(answer).toMatch(/^HTTP\/1\.1 408 /)
    expect(answer).toContain("RequestBodyTimeout")
    await stillServing()
  })

  it("closes a connection that never finishes its headers", async () => {
    const host = new URL(platform.url).host
    const answer = await holdOpen(platform.url, `POST /app/invoke/hello HTTP/1.1\r\nHost: ${host}\r\n`)
    expect(answer).toMatch(/^HTTP\/1\.1 408 /)
    await stillServing()
  })

  it("fails an answer over --max-response-bytes with AppFailed naming the limit, streamed or not", async () => {
    const small = await invoke(platform.url, "bulky", JSON.stringify({ bytes: 1000, stream: false }))
    expect(small.status).toBe(200)
    const large = await invoke(platform.url, "bulky", JSON.stringify({ bytes: 2 * 1024 * 1024, stream: false }))
    expect(large.status).toBe(500)
    const error = ((await large.json()) as { error: { code: string; message: string } }).error
    expect(error.code).toBe("AppFailed")
    expect(error.message).toContain(String(1024 * 1024))

    const streamed = await invoke(platform.url, "bulky", JSON.stringify({ bytes: 2 * 1024 * 1024, stream: true }))
    const lines = (await streamed.text()).trim().split("\n")
    expect(JSON.parse(lines[0]!)).toEqual({ data: "first" })
    const failure = (JSON.parse(lines[1]!) as { error: { code: string; message: string } }).error
    expect(failure.code).toBe("AppFailed")
    expect(failure.message).toContain(String(1024 * 1024))
    await stillServing()
  })

  it("quotes only a short prefix of a long app id or path it does not know", async () => {
    const longId = "a".repeat(10_000)
    for (const path of [`/app/invoke/${longId}`, `/app/${longId}/v1/chat/completions`, `/${longId}`]) {
      const response = await fetch(`${platform.url}${path}`, { method: "POST", body: "{}" })
      expect(response.status, path.slice(0, 20)).toBe(404)
      expect((await response.text()).length).toBeLessThan(1_000)
    }
  })
})

describe("cornserve serve on a non-loopback address", () => {
  const serveOn = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
    new Promise<{ code: number | null; output: string }>((resolve) => {
      void makeStateDir().then((stateDir) => {
        const child = spawn(
          process.execPath,
          [binPath, "serve", "--port", "0", "--state-dir", stateDir, "--devices", "cpu:0", ...args],
          { env: { ...process.env, CORNSERVE_ADMIN_TOKEN: "", ...env }, stdio: ["ignore", "pipe", "pipe"] }
        )
        let output = ""
        const onData = (chunk: Buffer) => {
          output += chunk.toString()
          if (output.includes("serving at")) child.kill("SIGTERM")
        }
        child.stdout.on("data", onData)
        child.stderr.on("data", onData)
        child.once("exit", (code) => {
          void removeStateDir(stateDir).then(() => resolve({ code, output }))
        })
      })
    })

  it("listens with the admin token it makes in its state dir when none is set, and says where", async () => {
    const started = await serveOn(["--host", "0.0.0.0"])
    expect(started.output).toMatch(/admin token made in \S+admin-token \(mode 0600/)
    expect(started.output).toContain("serving at")
  })

  it("listens with a token, or with --insecure-no-auth, which it says leaves the admin routes open", async () => {
    expect((await serveOn(["--host", "0.0.0.0"], { CORNSERVE_ADMIN_TOKEN: "secret" })).output).toContain("serving at")
    const open = await serveOn(["--host", "0.0.0.0", "--insecure-no-auth"])
    expect(open.output).toContain("serving at")
    expect(open.output).toContain("the admin routes take no token")
  })
})
