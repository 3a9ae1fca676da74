import { mkdir, readdir, writeFile } from "node:fs/promises"
import { basename, join, resolve } from "node:path"
import { installedManifest, installRoot, isSourceCheckout, packageDir } from "./Installation.js"

const appSource = `/**
 * An app: the tasks it calls, the schemas of its request and answer, and serve.
 * Register it with \`cornserve app register app.ts\`, or work on it with \`cornserve app dev app.ts\`.
 */
import * as Schema from "effect/Schema"
import { defineApp } from "cornserve/app"

export default defineApp({
  description: "Greets whoever it is asked to.",
  tasks: {},
  request: Schema.Struct({ name: Schema.String }),
  response: Schema.Struct({ greeting: Schema.String }),
  example: { name: "Ada" },
  serve: ({ name }) => ({ greeting: \`Hello, \${name}!\` })
})
`

/**
 * What an app folder depends on: the SDK, effect, and for its own type check TypeScript and Node's
 * types. From an installed package, by version: `cornserve` by a range of this package's version,
 * the others by the ranges this package depends on them with, so that npm installs one effect for
 * the app and the SDK. From a clone, whose version no registry has, `file:` links to the clone and
 * the packages it has installed (npm needs no network, and the types are exactly those the
 * platform runs with).
 */
const appDependencies = (): {
  readonly dependencies: Record<string, string>
  readonly devDependencies: Record<string, string>
} => {
  if (isSourceCheckout()) {
    const link = (name: string) => `file:${packageDir(name)}`
    return {
      dependencies: { cornserve: `file:${installRoot}`, effect: link("effect") },
      devDependencies: { typescript: link("typescript"), "@types/node": link("@types/node") }
    }
  }
  const { version, dependencies } = installedManifest()
  const range = (name: string) => dependencies[name] ?? "*"
  return {
    dependencies: { cornserve: `^${version}`, effect: range("effect") },
    devDependencies: { typescript: range("typescript"), "@types/node": range("@types/node") }
  }
}

/**
 * `cornserve init DIR`: an app folder in which \`npm install && npx tsc --noEmit\` type-checks the
 * app against the SDK it depends on (see `appDependencies`); packages the app needs are added with
 * npm as usual.
 */
export const initAppFolder = async (dir: string): Promise<ReadonlyArray<string>> => {
  const target = resolve(dir)
  const existing = await readdir(target).catch(() => undefined)
  if (existing !== undefined && existing.length > 0) {
    throw new Error(`${dir} is not empty: cornserve init writes a new app folder`)
  }
  await mkdir(target, { recursive: true })
  const name =
    basename(target)
      .toLowerCase()
      .replace(/[^a-z0-9._-]+/g, "-")
      .replace(/^[._-]+/, "") || "cornserve-app"
  const files: Record<string, string> = {
    "app.ts": appSource,
    "package.json": `${JSON.stringify(
      {
        name,
        private: true,
        type: "module",
        scripts: { check: "tsc --noEmit", dev: "cornserve app dev app.ts" },
        ...appDependencies()
      },
      null,
      2
    )}\n`,
    "tsconfig.json": `${JSON.stringify(
      {
        compilerOptions: {
          strict: true,
          noEmit: true,
          target: "ES2022",
          module: "ESNext",
          moduleResolution: "Bundler",
          allowImportingTsExtensions: true,
          skipLibCheck: true,
          types: ["node"]
        },
        include: ["*.ts"]
      },
      null,
      2
    )}\n`
  }
  for (const [file, text] of Object.entries(files)) await writeFile(join(target, file), text)
  return Object.keys(files)
}
