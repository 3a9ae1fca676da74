import { mkdir, mkdtemp, realpath, rm, symlink, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { bundleApp } from "../../src/cli/AppBundle.js"

const secretText = "-----BEGIN OPENSSH PRIVATE KEY----- not-a-real-key"

/** Writes `files` (path relative to `root`: content) into place. */
const layOut = async (root: string, files: Record<string, string>) => {
  for (const [path, content] of Object.entries(files)) {
    await mkdir(dirname(join(root, path)), { recursive: true })
    await writeFile(join(root, path), content)
  }
}

const packageJson = (name: string) => JSON.stringify({ name, type: "module", main: "index.js" })

const appImporting = (pkg: string) =>
  `import value from "${pkg}"\nimport { defineApp } from "cornserve/app"\n` +
  "export default defineApp({ tasks: {}, serve: () => ({ value }) } as never)\n"

describe("bundling an app takes files from its folder and its packages only", () => {
  let base = ""
  let secret = ""

  beforeAll(async () => {
    base = await realpath(await mkdtemp(join(tmpdir(), "cornserve-bundle-")))
    secret = join(base, "private", "id_ed25519")
    await layOut(base, { "private/id_ed25519": secretText })
  })

  afterAll(async () => {
    await rm(base, { recursive: true, force: true })
  })

  const refusedWith = async (app: string) => {
    const bundle = await bundleApp(app)
    if (bundle._tag !== "Refused") throw new Error(`bundled: ${bundle.source}`)
    expect(bundle.message).not.toContain(secretText)
    return bundle.message
  }

  it("refuses a package's import of an absolute path, naming the file and its importer", async () => {
    const app = join(base, "absolute")
    await layOut(app, {
      "app.ts": appImporting("evil"),
      "node_modules/evil/package.json": packageJson("evil"),
      "node_modules/evil/index.js": `import key from ${JSON.stringify(secret)} with { type: "text" }\nexport default key\n`
    })
    const message = await refusedWith(join(app, "app.ts"))
    expect(message).toContain(`${secret} (imported by ${join("node_modules", "evil", "index.js")}) is outside`)
  })

  it("refuses an import that climbs out of the folder with ..", async () => {
    const app = join(base, "climbing")
    await layOut(app, {
      "app.ts": `import key from "../private/id_ed25519" with { type: "text" }\nexport default key\n`
    })
    expect(await refusedWith(join(app, "app.ts"))).toContain(`${secret} (imported by app.ts) is outside`)
  })

  it("refuses a symlink in a package that leads out, by the file it leads to", async () => {
    const app = join(base, "linked-file")
    await layOut(app, {
      "app.ts": appImporting("words"),
      "node_modules/words/package.json": packageJson("words"),
      "node_modules/words/index.js": `import list from "./list.txt" with { type: "text" }\nexport default list\n`
    })
    await symlink(secret, join(app, "node_modules", "words", "list.txt"))
    expect(await refusedWith(join(app, "app.ts"))).toContain(
      `${secret} (imported by ${join("node_modules", "words", "index.js")}) is outside`
    )
  })

  it("refuses a package linked in from elsewhere (npm link), and names every outside file at once", async () => {
    const elsewhere = join(base, "checkout", "helper")
    await layOut(elsewhere, { "package.json": packageJson("helper"), "index.js": "export default 1\n" })
    const app = join(base, "linked-package")
    await layOut(app, {
      "app.ts": `import helper from "helper"\nimport key from "../private/id_ed25519" with { type: "text" }\nexport default [helper, key]\n`
    })
    await mkdir(join(app, "node_modules"))
    await symlink(elsewhere, join(app, "node_modules", "helper"))
    const message = await refusedWith(join(app, "app.ts"))
    expect(message).toContain(`${join(elsewhere, "index.js")} (imported by app.ts) is outside`)
    expect(message).toContain(`${secret} (imported by app.ts) is outside`)
  })

  it("bundles a package's own text file, naming it as data, and a package hoisted to a parent folder", async () => {
    const repo = join(base, "repo")
    const files = {
      "node_modules/hoisted/package.json": packageJson("hoisted"),
      "node_modules/hoisted/index.js": "export default 'hoisted'\n",
      "apps/greeter/app.ts": `import greeting from "greetings"\nimport hoisted from "hoisted"\nexport default [greeting, hoisted]\n`,
      "apps/greeter/node_modules/greetings/package.json": packageJson("greetings"),
      "apps/greeter/node_modules/greetings/index.js": `import text from "./hello.txt" with { type: "text" }\nexport default text\n`,
      "apps/greeter/node_modules/greetings/hello.txt": "hello from a text file"
    }
    await layOut(repo, files)
    const bytes = (path: keyof typeof files) => Buffer.byteLength(files[path])
    const bundle = await bundleApp(join(repo, "apps", "greeter", "app.ts"))
    if (bundle._tag !== "Bundled") throw new Error(bundle.message)
    expect(bundle.source).toContain("hello from a text file")
    expect(bundle.packages).toEqual(["greetings", "hoisted"])
    expect(bundle.inputs.map(({ name, code, bytes }) => ({ name, code, bytes }))).toEqual([
      // Outside the app's folder, a file is named by its absolute path.
      {
        name: join(repo, "node_modules", "hoisted", "index.js"),
        code: true,
        bytes: bytes("node_modules/hoisted/index.js")
      },
      { name: "app.ts", code: true, bytes: bytes("apps/greeter/app.ts") },
      {
        name: join("node_modules", "greetings", "hello.txt"),
        code: false,
        bytes: bytes("apps/greeter/node_modules/greetings/hello.txt")
      },
      {
        name: join("node_modules", "greetings", "index.js"),
        code: true,
        bytes: bytes("apps/greeter/node_modules/greetings/index.js")
      }
    ])
  })

  it("sends an app of its own file alone as it was written", async () => {
    const app = join(base, "alone")
    const source = `import { Schema } from "effect"\nexport default Schema.String\n`
    await layOut(app, { "app.ts": source })
    const bundle = await bundleApp(join(app, "app.ts"))
    expect(bundle).toMatchObject({ _tag: "Bundled", source, packages: [] })
    expect(bundle._tag === "Bundled" && bundle.inputs.map((input) => input.name)).toEqual(["app.ts"])
  })

  it("takes the app's own file through a link to it", async () => {
    const source = `import { Schema } from "effect"\nexport default Schema.Number\n`
    await layOut(base, { "kept/app.ts": source })
    await mkdir(join(base, "links"))
    await symlink(join(base, "kept", "app.ts"), join(base, "links", "app.ts"))
    expect(await bundleApp(join(base, "links", "app.ts"))).toMatchObject({ _tag: "Bundled", source })
  })
})
