import { createHash } from "node:crypto"
import { readFile, stat } from "node:fs/promises"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import {
  appState,
  eventually,
  invoke,
  makeStateDir,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * Admin routes always need a token, also on loopback: with none set, `serve` makes one in its state
 * dir (0600) and the CLI on the machine reads it there, so the quick start types no token. /metrics
 * needs a token unless made public; API keys guard the invoke and OpenAI routes.
 */

const hello = join(repoRoot, "examples", "hello.ts")

/** Invokes `app` with `key` as its bearer token, or with none. */
const invokeWithKey = (url: string, app: string, key?: string) =>
  fetch(`${url}/app/invoke/${app}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(key === undefined ? {} : { authorization: `Bearer ${key}` }) },
    body: JSON.stringify({ name: "Ada" })
  })

describe("tokens: the admin token made in the state dir, the metrics token and API keys", () => {
  const started: Array<RunningPlatform> = []
  let stateDir: string

  afterAll(async () => {
    for (const platform of started) await platform.stop()
    if (stateDir !== undefined) await removeStateDir(stateDir)
  })

  const start = async (args: ReadonlyArray<string>, env: Record<string, string>) => {
    const platform = await startPlatform({
      stateDir,
      args: ["--devices", "cpu:0", ...args],
      // No operator token: the platform makes its own.
      env: { CORNSERVE_ADMIN_TOKEN: "", ...env }
    })
    started.push(platform)
    return platform
  }

  it("makes a token in the state dir that admin routes need and the CLI on the machine reads", async () => {
    stateDir = await makeStateDir()
    const platform = await start(["--api-key", "key-one"], {
      CORNSERVE_METRICS_TOKEN: "metrics-secret",
      CORNSERVE_API_KEY: "key-two"
    })
    const tokenPath = join(stateDir, "admin-token")
    expect(platform.output()).toContain(`admin token made in ${tokenPath} (mode 0600`)
    expect((await stat(tokenPath)).mode & 0o777).toBe(0o600)
    const token = (await readFile(tokenPath, "utf8")).trim()
    expect(token.length).toBeGreaterThanOrEqual(32)

    const source = await readFile(hello, "utf8")
    const refused = await registerRaw(platform.url, { name: "hello", source }, null)
    expect(refused.status).toBe(401)
    expect(JSON.parse(refused.text).error.message).toContain(tokenPath)
    expect((await registerRaw(platform.url, { name: "hello", source }, "a-guess")).status).toBe(401)

    // The CLI finds the token in the state dir it is pointed at; elsewhere it has none and is refused.
    const cli = (env: Record<string, string>) =>
      runCli(["app", "register", hello], { CORNSERVE_GATEWAY_URL: platform.url, CORNSERVE_ADMIN_TOKEN: "", ...env })
    const elsewhere = await cli({ CORNSERVE_STATE_DIR: join(stateDir, "nowhere") })
    expect(elsewhere.code).not.toBe(0)
    expect(elsewhere.stderr).toContain("admin token")
    const registered = await cli({ CORNSERVE_STATE_DIR: stateDir })
    expect(registered.stderr + registered.stdout).toContain("app hello is ready")

    // /metrics: the metrics token or the admin token.
    expect((await fetch(`${platform.url}/metrics`)).status).toBe(401)
    for (const reader of ["metrics-secret", token]) {
      const metrics = await fetch(`${platform.url}/metrics`, { headers: { authorization: `Bearer ${reader}` } })
      expect(metrics.status).toBe(200)
      expect(await metrics.text()).toContain("cornserve_")
    }

    // API keys: either key (or the admin token) invokes; none or another is refused, unread.
    expect((await invokeWithKey(platform.url, "hello")).status).toBe(401)
    const wrongKey = await invokeWithKey(platform.url, "hello", "key-three")
    expect(wrongKey.status).toBe(401)
    expect(((await wrongKey.json()) as { error: { code: string } }).error.code).toBe("Unauthorized")
    for (const key of ["key-one", "key-two", token])
      expect((await invokeWithKey(platform.url, "hello", key)).status).toBe(200)
    const chat = await fetch(`${platform.url}/app/hello/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "hello", messages: [] })
    })
    expect(chat.status).toBe(401)
    await platform.stop()
  })

  it("keeps the token across restarts; --public-metrics opens /metrics, and no key opens invoke", async () => {
    const token = (await readFile(join(stateDir, "admin-token"), "utf8")).trim()
    const platform = await start(["--public-metrics"], {})
    expect(platform.output()).toContain(`admin token read from ${join(stateDir, "admin-token")}`)
    expect((await readFile(join(stateDir, "admin-token"), "utf8")).trim()).toBe(token)
    expect((await fetch(`${platform.url}/metrics`)).status).toBe(200)
    // Restored from the state dir, and open without a key.
    await eventually(async () => ((await appState(platform.url, "hello")) === "ready" ? true : undefined))
    expect((await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))).status).toBe(200)

    // An app's own keys, from its registration: its routes need one, other apps stay open.
    const appKey = "app-own-key-0123456789"
    const registered = await runCli(["app", "register", hello, "--name", "keyed", "--api-key", appKey], {
      CORNSERVE_GATEWAY_URL: platform.url,
      CORNSERVE_STATE_DIR: stateDir,
      CORNSERVE_ADMIN_TOKEN: ""
    })
    expect(registered.code, registered.stderr).toBe(0)
    expect((await invokeWithKey(platform.url, "keyed")).status).toBe(401)
    expect((await invokeWithKey(platform.url, "keyed", "not-the-app-key-000")).status).toBe(401)
    expect((await invokeWithKey(platform.url, "keyed", appKey)).status).toBe(200)
    expect((await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))).status).toBe(200)
    // Kept as its digest only (and still asked for after a restart: below).
    const stored = await readFile(join(stateDir, "apps", "keyed.json"), "utf8")
    expect(stored).not.toContain(appKey)
    expect(stored).toContain(createHash("sha256").update(appKey).digest("hex"))
    const tooShort = await registerRaw(
      platform.url,
      { name: "short", source: await readFile(hello, "utf8"), apiKeys: ["short"] },
      token
    )
    expect(tooShort.status).toBe(400)
    expect(tooShort.text).toContain("16 to 256 printable ASCII characters")

    const unregister = await fetch(`${platform.url}/app/unregister/hello`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}` }
    })
    expect(unregister.status).toBe(200)
    await platform.stop()
  })

  it("asks an app's own key again after a restart, from the digest it kept", async () => {
    const platform = await start([], {})
    await eventually(async () => ((await appState(platform.url, "keyed")) === "ready" ? true : undefined))
    expect((await invokeWithKey(platform.url, "keyed")).status).toBe(401)
    expect((await invokeWithKey(platform.url, "keyed", "app-own-key-0123456789")).status).toBe(200)
  })
})
