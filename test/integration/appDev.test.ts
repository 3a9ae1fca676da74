import { type ChildProcess, spawn } from "node:child_process"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  binPath,
  eventually,
  invoke,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const version = (greeting: string, extra = "") => `
import { Schema } from "effect"
import { defineApp } from "cornserve/app"
${extra}
export default defineApp({
  tasks: {},
  request: Schema.Struct({}),
  serve: () => {
    console.log("serving ${greeting}")
    return { greeting: "${greeting}" }
  }
})
`

describe("cornserve app dev: edit, save, call", () => {
  let platform: RunningPlatform
  let folder = ""
  let dev: ChildProcess | undefined
  let output = ""

  beforeAll(async () => {
    folder = await mkdtemp(join(tmpdir(), "cornserve-dev-"))
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
  }, 60_000)

  afterAll(async () => {
    dev?.kill("SIGINT")
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(folder, { recursive: true, force: true })
  })

  const greeting = async (appId = "dev_app") => {
    const response = await invoke(platform.url, appId, "{}")
    return response.status === 200 ? ((await response.json()) as { greeting: string }).greeting : undefined
  }

  it("registers the app, picks up each saved edit, prints compile errors and the app's own log", async () => {
    const file = join(folder, "dev_app.ts")
    await writeFile(file, version("first"))
    dev = spawn(process.execPath, [binPath, "app", "dev", file, "--gateway", platform.url], {
      cwd: repoRoot,
      stdio: ["ignore", "pipe", "pipe"]
    })
    dev.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    dev.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    expect(await eventually(greeting)).toBe("first")
    // The app's console.log reaches its author.
    await eventually(async () => (output.includes("serving first") ? true : undefined))

    // A syntax error is printed with its line; the running version keeps serving.
    await writeFile(file, version("broken", "const = 1"))
    await eventually(async () => (/dev_app\.ts:4:\d+: Expected identifier/.test(output) ? true : undefined)).catch(
      () => {
        throw new Error(`no error line in:\n${output}`)
      }
    )
    expect(await greeting()).toBe("first")

    const saved = Date.now()
    await writeFile(file, version("second"))
    expect(await eventually(async () => ((await greeting()) === "second" ? "second" : undefined))).toBe("second")
    // Reported, not asserted: how long an edit took to be served (no timing thresholds in tests).
    console.log(`app dev: an edit was served ${Date.now() - saved} ms after it was saved`)
    await eventually(async () => (output.includes("serving second") ? true : undefined))
  }, 120_000)

  it("registers a save made while the first type check runs", async () => {
    // A folder of its own: the first test's app dev still watches its folder.
    const earlyFolder = await mkdtemp(join(tmpdir(), "cornserve-dev-early-"))
    const file = join(earlyFolder, "early_app.ts")
    await writeFile(file, version("first"))
    const early = spawn(process.execPath, [binPath, "app", "dev", file, "--gateway", platform.url], {
      cwd: repoRoot,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let earlyOutput = ""
    early.stdout!.on("data", (chunk: Buffer) => (earlyOutput += chunk.toString()))
    early.stderr!.on("data", (chunk: Buffer) => (earlyOutput += chunk.toString()))
    try {
      // The app answers as soon as it is registered; its type check (seconds) starts then, and the
      // save lands while it runs, as an author's first edit does.
      const first = await eventually(() => greeting("early_app"), 60_000).catch(() => {
        throw new Error(`the app was not registered; app dev printed:\n${earlyOutput}`)
      })
      expect(first).toBe("first")
      await writeFile(file, version("second"))
      const served = await eventually(
        async () => ((await greeting("early_app")) === "second" ? "second" : undefined),
        45_000
      ).catch(() => {
        throw new Error(`the save was not registered; app dev printed:\n${earlyOutput}`)
      })
      expect(served).toBe("second")
    } finally {
      early.kill("SIGINT")
      await rm(earlyFolder, { recursive: true, force: true })
    }
  }, 150_000)
})
