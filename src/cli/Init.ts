import { mkdir, readdir, writeFile } from "node:fs/promises"
import { basename, join, resolve } from "node:path"
import { installRoot, packageDir } from "./AppCheck.js"

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
 * `cornserve init DIR`: an app folder in which \`npm install && npx tsc --noEmit\` type-checks the
 * app against this installation's SDK. Its package.json links the SDK, effect, TypeScript and
 * Node's types of this installation (file: dependencies, so that npm needs no network and the types
 * are exactly those the platform runs with); packages the app needs are added with npm as usual.
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
        dependencies: { cornserve: `file:${installRoot}`, effect: `file:${packageDir("effect")}` },
        devDependencies: {
          typescript: `file:${packageDir("typescript")}`,
          "@types/node": `file:${packageDir("@types/node")}`
        }
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
