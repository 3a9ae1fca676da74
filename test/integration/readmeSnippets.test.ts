import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { invoke, removeStateDir, repoRoot, runCli, type RunningPlatform, startPlatform } from "../support/platform.js"

interface Snippet {
  readonly name: string
  readonly source: string
}

/** A page's apps: each ```ts block that begins with `// NAME.ts`. */
const appsOf = (text: string): ReadonlyArray<Snippet> =>
  [...text.matchAll(/```ts\n\/\/ ([a-z_]+)\.ts\n([\s\S]*?)```/g)].map((match) => ({
    name: match[1]!,
    source: match[2]!
  }))

/** The apps of the docs' pages on writing apps (`docs/apps/`). */
const snippets = async (): Promise<ReadonlyArray<Snippet>> => {
  const folder = join(repoRoot, "docs", "apps")
  const pages = (await readdir(folder)).filter((file) => file.endsWith(".md")).sort()
  const texts = await Promise.all(pages.map((page) => readFile(join(folder, page), "utf8")))
  return texts.flatMap(appsOf)
}

describe("the app snippets of the docs' pages on writing apps run as written", () => {
  let platform: RunningPlatform
  let folder = ""

  beforeAll(async () => {
    folder = await mkdtemp(join(tmpdir(), "cornserve-readme-apps-"))
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
  }, 60_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(folder, { recursive: true, force: true })
  })

  it("the README's app is one of them, as written there", async () => {
    const apps = await snippets()
    const shown = appsOf(await readFile(join(repoRoot, "README.md"), "utf8"))
    expect(shown.length, "the README shows an app").toBeGreaterThan(0)
    for (const { name, source } of shown) expect(apps.find((app) => app.name === name)?.source, name).toBe(source)
  })

  it("type-checks, registers and answers its example, every one of them", async () => {
    const apps = await snippets()
    expect(apps.map((app) => app.name)).toEqual(
      expect.arrayContaining(["greet", "paint_it", "describe_it", "rank_texts"])
    )
    for (const { name, source } of apps) {
      const file = join(folder, `${name}.ts`)
      await writeFile(file, source)
      // Registered as a reader would: the CLI type-checks it first.
      const registered = await runCli(["app", "register", file, "--gateway", platform.url], {
        CORNSERVE_APP_CHECK: "on"
      })
      expect(registered.code, `${name}: ${registered.stderr}`).toBe(0)
      const { apps: listed } = (await (await fetch(`${platform.url}/app/list`)).json()) as {
        apps: Array<{ id: string; example?: unknown }>
      }
      const example = listed.find((app) => app.id === name)?.example
      expect(example, `${name} has an example`).toBeDefined()
      const response = await invoke(platform.url, name, JSON.stringify(example))
      const text = await response.text()
      expect(response.status, `${name}: ${text}`).toBe(200)
      expect(text, name).not.toContain('"error"')
    }
  }, 180_000)
})
