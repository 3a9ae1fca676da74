import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { invoke, removeStateDir, repoRoot, runCli, type RunningPlatform, startPlatform } from "../support/platform.js"

/** The apps of the README's "Writing an app": each ```ts block that begins with `// NAME.ts`. */
const snippets = async (): Promise<ReadonlyArray<{ readonly name: string; readonly source: string }>> => {
  const readme = await readFile(join(repoRoot, "README.md"), "utf8")
  const start = readme.indexOf("## Writing an app")
  const end = readme.indexOf("\n## ", start + 1)
  const section = readme.slice(start, end)
  return [...section.matchAll(/```ts\n\/\/ ([a-z_]+)\.ts\n([\s\S]*?)```/g)].map((match) => ({
    name: match[1]!,
    source: match[2]!
  }))
}

describe("the README's app snippets run as written", () => {
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

  it("type-checks, registers and answers its example, every one of them", async () => {
    const apps = await snippets()
    expect(apps.map((app) => app.name)).toEqual(expect.arrayContaining(["greet", "paint_it", "describe_it"]))
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
