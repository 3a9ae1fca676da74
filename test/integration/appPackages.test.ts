import { execFileSync } from "node:child_process"
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  eventually,
  invoke,
  removeStateDir,
  repoRoot,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

/**
 * An app folder as a team keeps one: its own package.json and node_modules, with a package
 * installed by npm (from a tarball packed from this project's own node_modules: no network here).
 */
const appSource = `
import YAML from "yaml"
import { Schema } from "effect"
import { defineApp } from "cornserve/app"
import { shout } from "./helpers.js"

export default defineApp({
  tasks: {},
  request: Schema.Struct({ text: Schema.String }),
  serve: ({ text }) => ({ parsed: YAML.parse(text), loud: shout("ok") })
})
`

describe("apps import npm packages installed beside them", () => {
  let platform: RunningPlatform
  let folder = ""

  beforeAll(async () => {
    folder = await mkdtemp(join(tmpdir(), "cornserve-app-folder-"))
    const tarball = execFileSync(
      "npm",
      ["pack", join(repoRoot, "node_modules", "yaml"), "--pack-destination", folder, "--silent"],
      { encoding: "utf8" }
    ).trim()
    const app = join(folder, "yaml-app")
    await mkdir(app)
    await writeFile(join(app, "package.json"), JSON.stringify({ name: "yaml-app", private: true, type: "module" }))
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--silent", join(folder, tarball)], {
      cwd: app
    })
    await writeFile(join(app, "app.ts"), appSource)
    await writeFile(join(app, "helpers.ts"), 'export const shout = (text: string) => text.toUpperCase() + "!"\n')
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
  }, 120_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(folder, { recursive: true, force: true })
  })

  it("bundles the package and a local module at registration, and answers before and after a restart", async () => {
    const registered = await runCli(["app", "register", join(folder, "yaml-app", "app.ts"), "--gateway", platform.url])
    expect(registered.code, registered.stderr).toBe(0)
    expect(registered.stderr).toContain("bundled with yaml")
    const ask = async () => {
      const response = await invoke(platform.url, "app", JSON.stringify({ text: "colours: [red, green]\ncount: 2" }))
      return { status: response.status, body: await response.json() }
    }
    const expected = { status: 200, body: { parsed: { colours: ["red", "green"], count: 2 }, loud: "OK!" } }
    expect(await ask()).toEqual(expected)
    // The platform keeps the bundle: the app's folder is not needed to restore it.
    await rm(join(folder, "yaml-app"), { recursive: true, force: true })
    await platform.stop()
    platform = await startPlatform({ stateDir: platform.stateDir, args: ["--devices", "cpu:0"] })
    // 503 while it is being restored.
    const answer = await eventually(async () => {
      const outcome = await ask()
      return outcome.status === 503 ? undefined : outcome
    }, 60_000)
    expect(answer).toEqual(expected)
  }, 120_000)

  it("refuses a package that needs a native addon, naming it, and one that is not installed", async () => {
    const app = join(folder, "native-app")
    await mkdir(join(app, "node_modules"), { recursive: true })
    await symlink(join(repoRoot, "node_modules", "onnxruntime-node"), join(app, "node_modules", "onnxruntime-node"))
    await writeFile(
      join(app, "native.ts"),
      `import * as ort from "onnxruntime-node"\nimport { Schema } from "effect"\nimport { defineApp } from "cornserve/app"\n` +
        `export default defineApp({ tasks: {}, request: Schema.Struct({}), serve: () => ({ v: String(ort.env.versions) }) })\n`
    )
    const native = await runCli(["app", "register", join(app, "native.ts"), "--gateway", platform.url])
    expect(native.code).toBe(1)
    expect(native.stderr).toContain('package "onnxruntime-node"')
    expect(native.stderr).toContain("native addon")

    await writeFile(join(app, "missing.ts"), `import _ from "left-pad-not-installed"\nexport default _\n`)
    // (The type check would refuse it first, naming the module too: here the bundler's message is wanted.)
    const missing = await runCli(["app", "register", join(app, "missing.ts"), "--no-check", "--gateway", platform.url])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toMatch(/missing\.ts:1:\d+: Could not resolve "left-pad-not-installed"/)
    const list = await runCli(["app", "list", "--gateway", platform.url])
    expect(list.stdout).not.toMatch(/native|missing/)
  }, 60_000)
})
