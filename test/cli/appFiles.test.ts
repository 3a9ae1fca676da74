import { mkdir, mkdtemp, realpath, rm, symlink } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import {
  appFolderOf,
  type BundleInput,
  dataFilesLine,
  inputListing,
  isCode,
  isWithin,
  mayBundle,
  nameIn
} from "../../src/cli/AppFiles.js"

describe("which files an app's bundle may take", () => {
  const dirs: Array<string> = []
  afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true })
  })

  it("takes a path below a root, never beside or above it", () => {
    expect(isWithin("/work/app", "/work/app")).toBe(true)
    expect(isWithin("/work/app", "/work/app/node_modules/x/index.js")).toBe(true)
    // A name that merely starts with two dots is inside.
    expect(isWithin("/work/app", "/work/app/..data/x.txt")).toBe(true)
    expect(isWithin("/work/app", "/work/app2/secret.txt")).toBe(false)
    expect(isWithin("/work/app", "/work/secret.txt")).toBe(false)
    expect(isWithin("/work/app", "/home/someone/.ssh/id_ed25519")).toBe(false)
  })

  it("allows the app's folder and the node_modules Node resolves from, by their real paths", async () => {
    const base = await realpath(await mkdtemp(join(tmpdir(), "cornserve-app-files-")))
    dirs.push(base)
    // A monorepo: packages hoisted to the root's node_modules, the app in a folder below.
    const app = join(base, "repo", "apps", "chat")
    await mkdir(join(app, "node_modules"), { recursive: true })
    await mkdir(join(base, "repo", "node_modules"), { recursive: true })
    // A sibling project's node_modules is not on the app's way up.
    await mkdir(join(base, "other", "node_modules"), { recursive: true })
    // The app's folder reached through a symlink: its real path counts.
    await symlink(app, join(base, "link"))
    const folder = appFolderOf(join(base, "link"))
    expect(mayBundle(folder, join(app, "app.ts"))).toBe(true)
    expect(mayBundle(folder, join(app, "node_modules", "yaml", "index.js"))).toBe(true)
    expect(mayBundle(folder, join(base, "repo", "node_modules", "yaml", "index.js"))).toBe(true)
    expect(mayBundle(folder, join(base, "repo", "apps", "secret.txt"))).toBe(false)
    expect(mayBundle(folder, join(base, "other", "node_modules", "x", "index.js"))).toBe(false)
    expect(nameIn(folder, join(app, "node_modules", "yaml", "index.js"))).toBe(join("node_modules", "yaml", "index.js"))
    expect(nameIn(folder, "/etc/passwd")).toBe("/etc/passwd")
  })

  it("counts as code only JavaScript and TypeScript imported as modules", () => {
    expect(isCode("/a/app.ts", {})).toBe(true)
    expect(isCode("/a/node_modules/x/index.cjs", {})).toBe(true)
    expect(isCode("/a/node_modules/x/index.js", { type: "text" })).toBe(false)
    expect(isCode("/a/node_modules/x/data.json", {})).toBe(false)
    expect(isCode("/a/node_modules/x/words.txt", { type: "text" })).toBe(false)
  })

  const input = (name: string, bytes: number, code: boolean): BundleInput => ({
    path: `/a/${name}`,
    name,
    bytes,
    code
  })

  it("names the data files a bundle inlines, and says nothing when it holds only code", () => {
    expect(dataFilesLine([input("app.ts", 10, true)])).toBeUndefined()
    expect(dataFilesLine([input("app.ts", 10, true), input("node_modules/x/data.txt", 3, false)])).toBe(
      "bundled 1 non-JavaScript file: node_modules/x/data.txt"
    )
    expect(
      dataFilesLine([input("node_modules/x/data.txt", 3, false), input("node_modules/x/table.json", 5, false)])
    ).toBe("bundled 2 non-JavaScript files: node_modules/x/data.txt, node_modules/x/table.json")
  })

  it("lists what a registration would send, each file with its size, and the total", () => {
    expect(inputListing([input("app.ts", 312, true), input("node_modules/x/data.txt", 3, false)], 2048)).toBe(
      [
        "2 files (bytes, name):",
        "  312  app.ts",
        "    3  node_modules/x/data.txt",
        "  315  in all, bundled into 2048 bytes"
      ].join("\n")
    )
    expect(inputListing([input("app.ts", 9, true)], 9)).toBe(
      "1 file (bytes, name):\n  9  app.ts\n  9  in all, sent as it is"
    )
  })
})
