import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { chromium } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type JsonDocument, openApiProblem, requestOf, schemaErrors } from "../support/openApi.js"
import {
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

const source = (path: string) => readFile(join(repoRoot, path), "utf8")
const appKey = "openapi-test-key-0123456789"

/** Headless Chromium (Debian's package; .ci/run installs it). */
const chromiumPath = "/usr/bin/chromium"

describe("apps that describe themselves: OpenAPI documents, /docs and app describe", () => {
  let platform: RunningPlatform
  let modelDir: string
  const get = (path: string, headers: Record<string, string> = {}) => fetch(`${platform.url}${path}`, { headers })
  const document = async (path: string, headers: Record<string, string> = {}) => {
    const response = await get(path, headers)
    expect(response.status, await response.clone().text()).toBe(200)
    return (await response.json()) as JsonDocument
  }

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    platform = await startPlatform({
      args: ["--devices", "cpu:0,cpu:1,cpu:2", "--sidecar-arena-bytes", String(64 * 1024 * 1024)],
      env: { CORNSERVE_MODEL_DIR: modelDir }
    })
    for (const [name, file, settings] of [
      ["hello", "examples/hello.ts", {}],
      ["countdown", "examples/countdown.ts", {}],
      ["color_chat", "examples/color_chat.ts", {}],
      ["keyed", "examples/hello.ts", { apiKeys: [appKey] }]
    ] as const) {
      const registered = await registerRaw(platform.url, { name, source: await source(file), ...settings })
      expect(registered.text, name).toContain("event: final")
    }
  }, 180_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    if (modelDir !== undefined) await rm(modelDir, { recursive: true, force: true })
  })

  it("serves the platform's document: valid OpenAPI 3.1, its routes and each app's, examples matching their schemas", async () => {
    const platformDocument = await document("/openapi.json")
    expect(await openApiProblem(platformDocument)).toBeUndefined()
    for (const path of [
      "/app/register",
      "/app/list",
      "/tasks/list",
      "/nodes/list",
      "/task/scale",
      "/health",
      "/ready",
      "/metrics"
    ])
      expect(platformDocument.paths[path], path).toBeDefined()
    expect(platformDocument.paths["/app/register"].post.security).toEqual([{ adminToken: [] }])
    for (const app of ["hello", "countdown", "color_chat"]) {
      const { schema, example } = requestOf(platformDocument, `/app/invoke/${app}`)
      expect(example, app).toBeDefined()
      expect(schemaErrors(platformDocument, schema, example), app).toEqual([])
    }
    expect(platformDocument.paths["/app/color_chat/v1/chat/completions"]).toBeDefined()
    // keyed's schemas are for callers with its key; the route is named all the same.
    const keyed = platformDocument.paths["/app/invoke/keyed"].post
    expect(keyed.security).toEqual([{ apiKey: [] }])
    expect(keyed.description).toContain("API key")
    expect(requestOf(platformDocument, "/app/invoke/keyed").schema).toEqual({})
  })

  it("serves each app's document: valid, with its request schema, example and answer", async () => {
    const hello = await document("/app/hello/openapi.json")
    expect(await openApiProblem(hello)).toBeUndefined()
    const { schema, example } = requestOf(hello, "/app/invoke/hello")
    expect(example).toEqual({ name: "Ada" })
    expect(schemaErrors(hello, schema, example)).toEqual([])
    expect(schemaErrors(hello, schema, { name: "" })).not.toEqual([])
    // The schema says what the app itself answers: a request it refuses, the schema refuses.
    const refused = await invoke(platform.url, "hello", JSON.stringify({ name: "" }))
    expect(refused.status).toBe(422)
    const countdown = await document("/app/countdown/openapi.json")
    expect(await openApiProblem(countdown)).toBeUndefined()
    expect(Object.keys(countdown.paths["/app/invoke/countdown"].post.responses["200"].content)).toEqual([
      "application/x-ndjson"
    ])
    const chat = await document("/app/color_chat/openapi.json")
    expect(await openApiProblem(chat)).toBeUndefined()
    expect(requestOf(chat, "/app/invoke/color_chat").schema).toEqual({
      $ref: "#/components/schemas/ChatCompletionRequest"
    })
    expect(Object.keys(chat.paths)).toEqual(
      expect.arrayContaining([
        "/app/color_chat/v1/chat/completions",
        "/app/color_chat/v1/completions",
        "/app/color_chat/v1/models"
      ])
    )
  })

  it("answers 404 for an unknown app, and an app's document follows its API-key rule", async () => {
    const unknown = await get("/app/nope/openapi.json")
    expect(unknown.status).toBe(404)
    expect(((await unknown.json()) as JsonDocument).error.code).toBe("AppNotFound")
    expect((await get("/app/nope/docs")).status).toBe(404)
    expect((await get("/app/keyed/openapi.json")).status).toBe(401)
    const keyed = await document("/app/keyed/openapi.json", { authorization: `Bearer ${appKey}` })
    expect(keyed.paths["/app/invoke/keyed"].post.security).toEqual([{ apiKey: [] }])
  })

  it("serves /docs: a page and its Swagger UI files, from the installation", async () => {
    const page = await get("/docs")
    expect(page.status).toBe(200)
    expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8")
    expect(page.headers.get("content-security-policy")).toContain("default-src 'none'")
    const html = await page.text()
    expect(html).toContain('data-url="/openapi.json"')
    const assets = [...html.matchAll(/(?:href|src)="(\/docs\/[^"]+)"/g)].map((match) => match[1]!)
    expect(assets).toEqual(expect.arrayContaining(["/docs/swagger-ui.css", "/docs/swagger-ui-bundle.js"]))
    const types: Record<string, string> = { css: "text/css", js: "text/javascript", png: "image/png" }
    for (const asset of assets) {
      const response = await get(asset)
      expect(response.status, asset).toBe(200)
      expect(response.headers.get("content-type"), asset).toContain(types[asset.split(".").pop()!]!)
      expect((await response.arrayBuffer()).byteLength, asset).toBeGreaterThan(0)
    }
    expect((await get("/docs/nope.js")).status).toBe(404)
    const appPage = await (await get("/app/hello/docs")).text()
    expect(appPage).toContain('data-url="/app/hello/openapi.json"')
  })

  it("renders /docs and an app's docs in headless Chromium with no request outside the gateway", async () => {
    const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] })
    try {
      for (const [path, shows] of [
        ["/docs", "/app/invoke/color_chat"],
        ["/app/hello/docs", "/app/invoke/hello"]
      ] as const) {
        const page = await browser.newPage()
        const requested: Array<string> = []
        const problems: Array<string> = []
        page.on("request", (request) => requested.push(request.url()))
        page.on("pageerror", (error) => problems.push(String(error)))
        page.on("console", (message) => {
          if (message.type() === "error") problems.push(message.text())
        })
        await page.goto(`${platform.url}${path}`)
        await page.waitForSelector(".opblock-summary-path", { timeout: 30_000 })
        expect(await page.textContent("body"), path).toContain(shows)
        expect(
          requested.filter((url) => !url.startsWith(`${platform.url}/`)),
          path
        ).toEqual([])
        expect(problems, path).toEqual([])
        await page.close()
      }
    } finally {
      await browser.close()
    }
  })

  it("asks for an API key on the docs of an app that has keys, and tries requests with it", async () => {
    const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] })
    try {
      const page = await browser.newPage()
      const problems: Array<string> = []
      page.on("pageerror", (error) => problems.push(String(error)))
      await page.goto(`${platform.url}/app/keyed/docs`)
      await page.waitForSelector(".cornserve-key input", { timeout: 30_000 })
      expect(await page.textContent("body")).toContain("needs an API key")
      await page.fill(".cornserve-key input", "not-the-key")
      await page.click(".cornserve-key button")
      // A locator, not waitForFunction: polling a string predicate needs eval, which the page's CSP refuses.
      await page.getByText("That key is not accepted").waitFor({ timeout: 30_000 })
      await page.fill(".cornserve-key input", appKey)
      await page.click(".cornserve-key button")
      await page.waitForSelector(".opblock-summary-path", { timeout: 30_000 })
      expect(await page.textContent("body")).toContain("/app/invoke/keyed")
      // A reload within the session keeps the key.
      await page.reload()
      await page.waitForSelector(".opblock-summary-path", { timeout: 30_000 })
      // Requests tried from the page carry it.
      const sent = (await page.evaluate("window.ui.getConfigs().requestInterceptor({ headers: {} })")) as {
        headers: Record<string, string>
      }
      expect(sent.headers.Authorization).toBe(`Bearer ${appKey}`)
      expect(problems).toEqual([])
    } finally {
      await browser.close()
    }
  })

  it("prints an app's description, request fields, answer and example with app describe", async () => {
    const env = { CORNSERVE_GATEWAY_URL: platform.url }
    const described = await runCli(["app", "describe", "hello"], env)
    expect(described.code, described.stderr).toBe(0)
    expect(described.stdout).toContain("Greets whoever it is asked to greet.")
    expect(described.stdout).toContain("Request: POST /app/invoke/hello")
    expect(described.stdout).toMatch(/^ {4}name: string, 1 to 200 characters$/m)
    expect(described.stdout).toMatch(/^ {4}greeting: string$/m)
    expect(described.stdout).toContain('"name": "Ada"')
    const json = await runCli(["app", "describe", "hello", "--json"], env)
    expect(JSON.parse(json.stdout).openapi).toBe("3.1.0")
    const unknown = await runCli(["app", "describe", "nope"], env)
    expect(unknown.code).not.toBe(0)
    expect(unknown.stderr).toContain("AppNotFound")
  })

  it("refuses an app whose process sends schemas nested too deeply, and goes on serving", async () => {
    const registered = await registerRaw(platform.url, {
      name: "forger_schemas",
      source: await source("test/fixtures/apps/ipc_forger_schemas.ts")
    })
    expect(registered.status).toBe(400)
    expect(JSON.parse(registered.text).error.message).toContain("nest deeper than the limit")
    expect((await get("/app/forger_schemas/openapi.json")).status).toBe(404)
    expect(await openApiProblem(await document("/openapi.json"))).toBeUndefined()
    const greeted = await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))
    expect(greeted.status).toBe(200)
  })
})
