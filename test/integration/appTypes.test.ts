import { execFileSync, spawnSync } from "node:child_process"
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { invoke, removeStateDir, runCli, type RunningPlatform, startPlatform } from "../support/platform.js"

describe("apps are type-checked against the SDK's declarations", () => {
  let platform: RunningPlatform
  let root = ""
  let folder = ""

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-init-"))
    folder = join(root, "greeter")
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
  }, 60_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(root, { recursive: true, force: true })
  })

  it("cornserve init writes a folder that type-checks with its own tsc after npm install", async () => {
    const init = await runCli(["init", folder])
    expect(init.code, init.stderr).toBe(0)
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--silent"], { cwd: folder })
    const tsc = spawnSync("npx", ["--no-install", "tsc", "--noEmit"], { cwd: folder, encoding: "utf8" })
    expect(tsc.status, tsc.stdout + tsc.stderr).toBe(0)
    // A type error: its own tsc says where.
    const source = await readFile(join(folder, "app.ts"), "utf8")
    await writeFile(
      join(folder, "app.ts"),
      source.replace(/\(\{ greeting: `Hello, \$\{name\}!` \}\)/, "({ greeting: name.length })")
    )
    const broken = spawnSync("npx", ["--no-install", "tsc", "--noEmit"], { cwd: folder, encoding: "utf8" })
    expect(broken.status).not.toBe(0)
    expect(broken.stdout).toMatch(/app\.ts\(\d+,\d+\): error TS2322/)
    // refuse init over a folder that has files
    const again = await runCli(["init", folder])
    expect(again.code).toBe(1)
    expect(again.stderr).toContain("is not empty")
  }, 120_000)

  it("app check and app register refuse a type error with its file:line:col; --no-check registers anyway", async () => {
    const file = join(root, "typed.ts")
    await writeFile(
      file,
      [
        'import { Schema } from "effect"',
        'import { defineApp } from "cornserve/app"',
        "export default defineApp({",
        "  tasks: {},",
        "  request: Schema.Struct({ n: Schema.Number }),",
        "  serve: ({ n }) => { const text: string = n; return { text } }",
        "})",
        ""
      ].join("\n")
    )
    const check = await runCli(["app", "check", file])
    expect(check.code).toBe(1)
    expect(check.stderr).toContain(`${file}:6:29: error TS2322: Type 'number' is not assignable to type 'string'.`)
    const register = await runCli(["app", "register", file, "--gateway", platform.url], { CORNSERVE_APP_CHECK: "on" })
    expect(register.code).toBe(1)
    expect(register.stderr).toContain("1 type error(s) (app register --no-check registers it anyway)")
    expect(register.stderr).toContain(`${file}:6:29`)
    expect((await invoke(platform.url, "typed", "{}")).status, "nothing was registered").toBe(404)
    const unchecked = await runCli(["app", "register", file, "--no-check", "--gateway", platform.url])
    expect(unchecked.code, unchecked.stderr).toBe(0)
    const answer = await invoke(platform.url, "typed", JSON.stringify({ n: 3 }))
    expect(await answer.json()).toEqual({ text: 3 })
  }, 120_000)
})
