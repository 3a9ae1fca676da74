import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { type Browser, chromium, type Page } from "playwright-core"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform,
  testAdminToken
} from "../support/platform.js"

/** Headless Chromium (Debian's package; .ci/run installs it). */
const chromiumPath = "/usr/bin/chromium"

const source = (name: string) => readFile(join(repoRoot, "examples", `${name}.ts`), "utf8")

/** How many points each polyline of the page draws. */
const pointCounts = (page: Page, selector: string) =>
  page
    .locator(selector)
    .evaluateAll((lines) => lines.map((line) => (line.getAttribute("points") ?? "").trim().split(/\s+/).length))

/**
 * The web console at /console, in headless Chromium against a real platform with example apps: it
 * lists them, registers an app with the admin token (and shows the 401 without it), names the colour
 * of an uploaded picture through color_chat's streamed OpenAI route, plays color_studio's tone, draws
 * task profiles and live metrics, under the page's strict Content-Security-Policy. Each page's
 * screenshot is written to a temporary folder, and to CORNSERVE_SCREENSHOTS when set (`docs`: the
 * pictures of docs/getting-started.md).
 */
describe("the web console", () => {
  let platform: RunningPlatform
  let modelDir: string
  let shotsDir: string
  let redPng: string
  let browser: Browser
  let page: Page
  /** Errors the page logged or threw, and whether a 401 was expected when each came. */
  const problems: Array<{ readonly text: string; readonly during401: boolean }> = []
  const outside: Array<string> = []
  const chatRequests: Array<string> = []
  let expecting401 = false

  const screenshot = async (name: string) => {
    const path = join(shotsDir, `console-${name}.png`)
    await page.screenshot({ path })
    const wanted = process.env.CORNSERVE_SCREENSHOTS
    if (wanted !== undefined && wanted !== "") {
      await mkdir(wanted, { recursive: true })
      // A palette PNG: a quarter of the size, for the docs.
      await sharp(path)
        .png({ palette: true, compressionLevel: 9 })
        .toFile(join(wanted, `console-${name}.png`))
    }
    expect((await readFile(path)).subarray(1, 4).toString()).toBe("PNG")
  }

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    shotsDir = await mkdtemp(join(tmpdir(), "cornserve-console-"))
    redPng = join(shotsDir, "red.png")
    await writeFile(
      redPng,
      await sharp({ create: { width: 8, height: 8, channels: 3, background: { r: 220, g: 20, b: 20 } } })
        .png()
        .toBuffer()
    )
    platform = await startPlatform({
      args: ["--devices", "cpu:0,cpu:1,cpu:2", "--sidecar-arena-bytes", String(64 * 1024 * 1024)],
      env: { CORNSERVE_MODEL_DIR: modelDir }
    })
    const [launched] = await Promise.all([
      chromium.launch({
        executablePath: chromiumPath,
        // Chromium's audio (the playground plays what an app says) goes through PulseAudio's client,
        // which would otherwise make a pulse-* folder in /tmp that outlives the test.
        env: { ...process.env, XDG_RUNTIME_DIR: shotsDir },
        args: [
          "--no-sandbox",
          "--disable-gpu",
          "--disable-background-networking",
          "--autoplay-policy=no-user-gesture-required"
        ]
      }),
      (async () => {
        // color_studio shares color_chat's encoders and LLM: registered after it, it deploys only its generators.
        for (const name of ["hello", "countdown", "color_chat", "color_studio"]) {
          const registered = await registerRaw(platform.url, { name, source: await source(name) })
          expect(registered.text, name).toContain("event: final")
        }
      })()
    ])
    browser = launched
    page = await browser.newPage({ viewport: { width: 1200, height: 800 } })
    page.on("pageerror", (error) => problems.push({ text: String(error), during401: expecting401 }))
    page.on("console", (message) => {
      if (message.type() === "error") problems.push({ text: message.text(), during401: expecting401 })
    })
    page.on("request", (request) => {
      const url = request.url()
      if (!url.startsWith(`${platform.url}/`) && !url.startsWith("data:") && !url.startsWith("blob:")) outside.push(url)
      if (url.includes("/v1/chat/completions")) chatRequests.push(url)
    })
  }, 180_000)

  afterAll(async () => {
    await browser?.close()
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    if (modelDir !== undefined) await rm(modelDir, { recursive: true, force: true })
    if (shotsDir !== undefined) await rm(shotsDir, { recursive: true, force: true })
  })

  it("is served from the installation under a strict CSP, and nothing outside it", async () => {
    const index = await fetch(`${platform.url}/console`)
    expect(index.status).toBe(200)
    expect(index.headers.get("content-type")).toBe("text/html; charset=utf-8")
    const policy = index.headers.get("content-security-policy") ?? ""
    expect(policy).toContain("script-src 'self';")
    expect(policy).not.toContain("unsafe-inline")
    expect(policy).toContain("connect-src 'self'")
    const html = await index.text()
    // The built page: hashed assets, no inline script.
    const script = /<script type="module" crossorigin src="(\/console\/assets\/[\w-]+\.js)"><\/script>/.exec(html)
    expect(script, html).not.toBeNull()
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/)
    const asset = await fetch(`${platform.url}${script![1]}`)
    expect(asset.status).toBe(200)
    expect(asset.headers.get("content-type")).toBe("text/javascript; charset=utf-8")
    expect(asset.headers.get("cache-control")).toContain("immutable")
    expect((await fetch(`${platform.url}/console/`)).status).toBe(200)
    for (const path of [
      "/console/nope.js",
      "/console/assets/nope.js",
      "/console/..%2Fpackage.json",
      "/console/assets/..%2F..%2Fcontrol%2Fgateway%2FGateway.js",
      "/console/%2e%2e/package.json",
      "/console/.hidden.js",
      "/console/a/b/c"
    ]) {
      const refused = await fetch(`${platform.url}${path}`)
      expect(refused.status, path).toBe(404)
      expect(((await refused.json()) as { error: { code: string } }).error.code, path).toBe("RouteNotFound")
    }
  })

  it("lists the apps; registering is refused without the admin token and works with it", async () => {
    await page.goto(`${platform.url}/console`)
    for (const app of ["color_chat", "color_studio", "countdown", "hello"])
      await page.locator(`tr[data-app="${app}"]`).waitFor({ timeout: 15_000 })
    expect(await page.locator(`tr[data-app="color_chat"] .state`).textContent()).toBe("ready")
    expect(problems).toEqual([])

    await page.setInputFiles("input[name=app-file]", join(repoRoot, "examples", "hello.ts"))
    await page.fill("input[name=app-name]", "hello_console")
    expecting401 = true
    await page.click(".register button[type=submit]")
    const refusal = page.locator(".register .refusal")
    await refusal.waitFor({ timeout: 15_000 })
    expect(await refusal.textContent()).toContain("Refused (401)")
    expect(await refusal.textContent()).toContain("this route needs the admin token")
    expecting401 = false

    await page.fill(".register .refusal input[type=password]", testAdminToken)
    await page.click(".register .refusal button[type=submit]")
    await page.locator(".registration.done").waitFor({ timeout: 30_000 })
    expect(await page.locator(".registration").textContent()).toContain("app hello_console is ready")
    await page.locator(`tr[data-app="hello_console"]`).waitFor({ timeout: 15_000 })
    // The token is the tab's, in sessionStorage only.
    expect(await page.evaluate(`sessionStorage.getItem("cornserve-admin-token")`)).toBe(testAdminToken)
    expect(await page.evaluate("localStorage.length")).toBe(0)
    await screenshot("apps")
  })

  it("names the colour of an uploaded picture in color_chat's playground, streamed over OpenAI's route", async () => {
    await page.goto(`${platform.url}/console#/play/color_chat`)
    await page.locator(".composer textarea").waitFor({ timeout: 15_000 })
    // The example's own picture goes; the uploaded one is what is asked about.
    await page.locator(".composer .attachment .remove").click()
    await page.setInputFiles("input.attach", redPng)
    await page.locator(".composer .attachment img").waitFor()
    await page.fill(".composer textarea", "What colour is this picture?")
    await page.click(".composer button[type=submit]")
    const answer = page.locator(".turn.assistant .answer.done")
    await answer.waitFor({ timeout: 30_000 })
    expect(await answer.locator(".answer-text").textContent()).toContain("red")
    expect(chatRequests).toEqual([`${platform.url}/app/color_chat/v1/chat/completions`])
    await screenshot("playground")
  })

  it("plays color_studio's tone: its PCM16 chunks as one WAV in an <audio> element", async () => {
    await page.goto(`${platform.url}/console#/play/color_studio`)
    await page.locator(".composer textarea").waitFor({ timeout: 15_000 })
    await page.selectOption("select[name=output]", JSON.stringify("audio"))
    await page.click(".composer button[type=submit]")
    const audio = page.locator(".turn.assistant .answer.done audio")
    await audio.waitFor({ timeout: 30_000 })
    expect(await audio.getAttribute("src")).toMatch(/^blob:/)
    const duration = await audio.evaluate(
      (element) =>
        new Promise<number>((resolve) => {
          const media = element as unknown as { readyState: number; duration: number } & EventTarget
          if (media.readyState >= 1) resolve(media.duration)
          else media.addEventListener("loadedmetadata", () => resolve(media.duration))
        })
    )
    expect(duration).toBeGreaterThan(0)
    expect(await page.locator(".turn.assistant .answer").textContent()).toContain('"colour":"red"')
  })

  it("shows tasks, the devices they share and a task's profile curves", async () => {
    await page.goto(`${platform.url}/console#/tasks`)
    await page.locator(".tasks-table tr[data-task^='llm-']").waitFor({ timeout: 15_000 })
    expect(await page.locator(".tasks-table tr[data-task^='llm-']").textContent()).toContain("color_chat, color_studio")
    expect(await page.locator(".nodes-table tr[data-node='local']").count()).toBe(1)
    // The LLM's profile opens first; color_chat's and color_studio's calls are on its curves.
    await page.locator(".profile polyline.series").first().waitFor({ state: "attached", timeout: 15_000 })
    expect(Math.min(...(await pointCounts(page, ".profile polyline.series")))).toBeGreaterThanOrEqual(1)
    await screenshot("tasks")
  })

  it("draws live metrics from /metrics with the admin token", async () => {
    await page.goto(`${platform.url}/console#/metrics`)
    const rates = "figure[data-title='Requests per second, by app'] polyline.series"
    await page.locator(rates).first().waitFor({ state: "attached", timeout: 15_000 })
    // Requests while a few scrapes go by: the page derives each point from two of them.
    const pointsNow = async () => Math.max(0, ...(await pointCounts(page, rates)))
    const deadline = Date.now() + 20_000
    while ((await pointsNow()) < 4 && Date.now() < deadline) {
      expect((await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))).status).toBe(200)
      await new Promise((resolve) => setTimeout(resolve, 300))
    }
    expect(await pointsNow()).toBeGreaterThanOrEqual(4)
    const latency = "figure[data-title='Request latency (status 200, all apps)'] polyline.series"
    expect((await pointCounts(page, latency)).length).toBeGreaterThan(0)
    await screenshot("metrics")
  })

  it("logged no error but the 401 it was shown, and asked nothing of another origin", () => {
    expect(problems.filter((problem) => !(problem.during401 && problem.text.includes("401")))).toEqual([])
    expect(outside).toEqual([])
  })
})
