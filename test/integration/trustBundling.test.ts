import { randomUUID } from "node:crypto"
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { appState, invoke, removeStateDir, runCli, type RunningPlatform, startPlatform } from "../support/platform.js"

/** Writes `files` (path relative to `root`: content) into place, as npm would have installed them. */
const layOut = async (root: string, files: Record<string, string>) => {
  for (const [path, content] of Object.entries(files)) {
    await mkdir(dirname(join(root, path)), { recursive: true })
    await writeFile(join(root, path), content)
  }
}

const packageJson = (name: string) => JSON.stringify({ name, version: "1.0.0", type: "module", main: "index.js" })

/** An app that pads its text with a package's help. */
const appUsing = (pkg: string) => `
import { Schema } from "effect"
import { defineApp } from "cornserve/app"
import { pad } from "${pkg}"

export default defineApp({
  tasks: {},
  request: Schema.Struct({ text: Schema.String }),
  serve: ({ text }) => ({ padded: pad(text) })
})
`

/** Every file's text under `dir`, for a search of what the platform keeps. */
const textsUnder = async (dir: string): Promise<Array<{ path: string; text: string }>> => {
  const found: Array<{ path: string; text: string }> = []
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile()) continue
    const path = join(entry.parentPath, entry.name)
    found.push({ path, text: await readFile(path, "utf8").catch(() => "") })
  }
  return found
}

describe("bundling takes nothing from outside the app's folder, and says what it takes", () => {
  let platform: RunningPlatform
  let folder = ""
  let secretPath = ""
  const secret = `ssh-ed25519-private ${randomUUID()}`

  beforeAll(async () => {
    folder = await mkdtemp(join(tmpdir(), "cornserve-trust-bundling-"))
    secretPath = join(folder, "home", ".ssh", "id_ed25519")
    await layOut(folder, { "home/.ssh/id_ed25519": secret })
    // A package that ships the author's key inside the bundle, through an absolute path.
    await layOut(join(folder, "hostile"), {
      "app.ts": appUsing("tiny-pad"),
      "node_modules/tiny-pad/package.json": packageJson("tiny-pad"),
      "node_modules/tiny-pad/index.js":
        `import key from ${JSON.stringify(secretPath)} with { type: "text" }\n` +
        "export const pad = (text) => ' ' + text + ' '\nexport const leaked = key\n"
    })
    // A package that inlines a text file of its own: allowed, and named.
    await layOut(join(folder, "framed"), {
      "app.ts": appUsing("frame-pad"),
      "node_modules/frame-pad/package.json": packageJson("frame-pad"),
      "node_modules/frame-pad/index.js":
        'import frame from "./frame.txt" with { type: "text" }\n' +
        "export const pad = (text) => frame.trim() + text + frame.trim()\n",
      "node_modules/frame-pad/frame.txt": "~~\n"
    })
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
  }, 60_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(folder, { recursive: true, force: true })
  })

  it("refuses a dependency that imports a file outside the app's folder, naming it and its importer", async () => {
    const app = join(folder, "hostile", "app.ts")
    const importer = join("node_modules", "tiny-pad", "index.js")

    const dryRun = await runCli(["app", "register", app, "--dry-run", "--gateway", platform.url])
    expect(dryRun.code, dryRun.stderr).toBe(1)
    expect(dryRun.stderr).toContain(`${secretPath} (imported by ${importer}) is outside the app's folder`)
    expect(dryRun.stdout + dryRun.stderr).not.toContain(secret)

    const registered = await runCli(["app", "register", app, "--gateway", platform.url])
    expect(registered.code, registered.stderr).toBe(1)
    expect(registered.stderr).toContain(`${secretPath} (imported by ${importer}) is outside the app's folder`)
    expect(registered.stdout + registered.stderr).not.toContain(secret)

    // Nothing reached the platform: no app, and not a byte of the key in anything it keeps or printed.
    expect(await appState(platform.url, "app")).toBeUndefined()
    const kept = await textsUnder(platform.stateDir)
    expect(kept.filter(({ text }) => text.includes(secret)).map(({ path }) => path)).toEqual([])
    expect(platform.output()).not.toContain(secret)
  }, 60_000)

  it("lists what --dry-run would send without sending it, and names a package's data file", async () => {
    const app = join(folder, "framed", "app.ts")
    const dryRun = await runCli(["app", "register", app, "--name", "framed", "--dry-run", "--gateway", platform.url])
    expect(dryRun.code, dryRun.stderr).toBe(0)
    expect(dryRun.stderr).toContain("bundled with frame-pad")
    expect(dryRun.stderr).toContain(`bundled 1 non-JavaScript file: ${join("node_modules", "frame-pad", "frame.txt")}`)
    const appBytes = Buffer.byteLength(await readFile(app))
    const indexBytes = Buffer.byteLength(
      await readFile(join(folder, "framed", "node_modules", "frame-pad", "index.js"))
    )
    const rows = dryRun.stdout.split("\n").map((line) => line.trim())
    expect(rows).toContain(`${appBytes}  app.ts`)
    expect(rows).toContain(`3  ${join("node_modules", "frame-pad", "frame.txt")}`)
    expect(rows).toContain(`${indexBytes}  ${join("node_modules", "frame-pad", "index.js")}`)
    expect(rows.some((row) => row.startsWith(`${appBytes + indexBytes + 3}  in all`))).toBe(true)
    expect(dryRun.stdout).toContain("nothing was sent")
    expect(await appState(platform.url, "framed")).toBeUndefined()

    const registered = await runCli(["app", "register", app, "--name", "framed", "--gateway", platform.url])
    expect(registered.code, registered.stderr).toBe(0)
    expect(registered.stderr).toContain(
      `bundled 1 non-JavaScript file: ${join("node_modules", "frame-pad", "frame.txt")}`
    )
    const response = await invoke(platform.url, "framed", JSON.stringify({ text: "hi" }))
    expect(await response.json()).toEqual({ padded: "~~hi~~" })
  }, 60_000)

  it("names --dry-run in app register's help", async () => {
    const help = await runCli(["app", "register", "--help"])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("--dry-run")
    expect(help.stdout).toContain("list every file that would be sent")
  })
})
