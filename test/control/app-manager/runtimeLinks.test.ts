import { spawnSync } from "node:child_process"
import { mkdirSync, realpathSync, symlinkSync, writeFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { installedRuntime, linksOn, runtimeLayout } from "../../../src/control/app-manager/AppRuntimeFiles.js"

/**
 * An app's process loads the SDK and `effect` under Node's permission model, which checks each file
 * by the name it is read under. Node's module resolver finds a package by its name in a
 * node_modules and then resolves that name's links one by one, checking each link by its own name:
 * a checkout whose node_modules is a link to another's, or a pnpm store (every package a link),
 * needs those links named too, or every app fails to load ("Access to this API has been
 * restricted").
 */

/** A package `name` in `dir`: an ES module that default-exports its name joined to what its dependencies export. */
const writePackage = (dir: string, name: string, dependencies: ReadonlyArray<string> = []) => {
  mkdirSync(dir, { recursive: true })
  writeFileSync(
    join(dir, "package.json"),
    JSON.stringify({
      name,
      version: "1.0.0",
      type: "module",
      exports: "./index.js",
      dependencies: Object.fromEntries(dependencies.map((dependency) => [dependency, "1.0.0"]))
    })
  )
  writeFileSync(
    join(dir, "index.js"),
    `${dependencies.map((dependency, i) => `import d${i} from ${JSON.stringify(dependency)}\n`).join("")}` +
      `export default [${JSON.stringify(name)}${dependencies.map((_, i) => `, d${i}`).join("")}].join("+")\n`
  )
}

describe("the app runtime reached through links", () => {
  let root: string
  /** The store another checkout installed: effect in it, its dependency a pnpm-style link. */
  let store: string
  /** A checkout whose node_modules is a link to the store's, and its SDK directory. */
  let checkout: string
  let sdk: string

  beforeAll(async () => {
    root = realpathSync(await mkdtemp(join(tmpdir(), "cornserve-runtime-links-")))
    store = join(root, "store")
    writePackage(join(store, "node_modules", "effect"), "effect", ["fast-check"])
    writePackage(join(store, "node_modules", ".pnpm", "fast-check@1.0.0", "node_modules", "fast-check"), "fast-check")
    symlinkSync(
      join(".pnpm", "fast-check@1.0.0", "node_modules", "fast-check"),
      join(store, "node_modules", "fast-check")
    )
    checkout = join(root, "checkout")
    sdk = join(checkout, "dist", "app-runtime")
    mkdirSync(sdk, { recursive: true })
    writeFileSync(join(sdk, "entry.mjs"), 'import effect from "effect"\nconsole.log(effect)\n')
    symlinkSync(join(store, "node_modules"), join(checkout, "node_modules"))
  })

  afterAll(async () => {
    await rm(root, { recursive: true, force: true })
  })

  /** Runs the SDK's entry under the permission model, allowed to read `paths`. */
  const runEntry = (paths: ReadonlyArray<string>) =>
    spawnSync(
      process.execPath,
      [
        "--experimental-permission",
        "--no-warnings=ExperimentalWarning",
        ...paths.map((path) => `--allow-fs-read=${path}`),
        join(sdk, "entry.mjs")
      ],
      { encoding: "utf8", cwd: root, env: {} }
    )

  it("finds each package where Node does, by its real directory, and the links on the way by their own names", () => {
    const { dirs, links } = runtimeLayout(sdk)
    expect(dirs.map((dir) => [dir.path, dir.copyAs])).toEqual([
      [sdk, "app-runtime"],
      [join(store, "node_modules", "effect"), join("node_modules", "effect")],
      [
        join(store, "node_modules", ".pnpm", "fast-check@1.0.0", "node_modules", "fast-check"),
        join("node_modules", "fast-check")
      ]
    ])
    expect(links).toEqual([join(checkout, "node_modules"), join(store, "node_modules", "fast-check")])
  })

  it("loads under the permission model with the links named, and is refused without them", () => {
    const runtime = installedRuntime(sdk)!
    expect(runtime.readableLinks).toEqual(runtimeLayout(sdk).links)
    const loaded = runEntry([...runtime.readableDirs, ...runtime.readableLinks])
    expect(loaded.stderr).toBe("")
    expect(loaded.stdout.trim()).toBe("effect+fast-check")

    const refused = runEntry(runtime.readableDirs)
    expect(refused.status).not.toBe(0)
    expect(refused.stderr).toContain("ERR_ACCESS_DENIED")
    expect(refused.stderr).toContain(join(checkout, "node_modules"))
  })

  it("follows a link whose target passes another link, each by the name it has where it is met", () => {
    const home = join(root, "home")
    symlinkSync(root, home)
    const elsewhere = join(root, "elsewhere")
    mkdirSync(elsewhere)
    symlinkSync(join(home, "store", "node_modules"), join(elsewhere, "node_modules"))
    expect(linksOn(join(elsewhere, "node_modules", "fast-check", "index.js"))).toEqual([
      join(elsewhere, "node_modules"),
      home,
      join(store, "node_modules", "fast-check")
    ])
  })

  it("is not named where a link outside any node_modules lies on the way: naming it would open all below it, so apps load a copy", () => {
    const other = join(root, "other")
    const otherSdk = join(other, "dist", "app-runtime")
    mkdirSync(otherSdk, { recursive: true })
    // The store reached through a link to its parent (a home directory that is a link, say).
    const alias = join(root, "alias")
    symlinkSync(root, alias)
    symlinkSync(join(alias, "store", "node_modules"), join(other, "node_modules"))
    expect(runtimeLayout(otherSdk).links).toEqual([
      join(other, "node_modules"),
      alias,
      join(store, "node_modules", "fast-check")
    ])
    expect(installedRuntime(otherSdk)).toBeUndefined()
  })

  it("has no links where the packages are plain directories", () => {
    const plain = join(root, "plain")
    const plainSdk = join(plain, "dist", "app-runtime")
    mkdirSync(plainSdk, { recursive: true })
    writePackage(join(plain, "node_modules", "effect"), "effect")
    expect(runtimeLayout(plainSdk).links).toEqual([])
    expect(installedRuntime(plainSdk)!.readableDirs).toEqual([
      `${plainSdk}/`,
      `${join(plain, "node_modules", "effect")}/`
    ])
  })
})
