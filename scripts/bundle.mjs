/**
 * Bundles the compiled platform (`dist/`) into `dist/bundle/`, which `bin/cornserve` runs.
 *
 * Why: every process of the platform loads its modules at start, and an executor's three processes
 * start on a cold start's path. From `dist/`, Node resolves, reads and compiles some 600 files per
 * process (effect alone is hundreds); from one bundle, a few files. Measured on a 2-core machine: an
 * executor's router loads in 0.6 CPU-s instead of 1.75, its engine in 0.2 instead of 0.75, its
 * worker in 0.3 instead of 0.95, and each holds 20-25 MiB less.
 *
 * What stays as it is:
 * - `dist/` itself: apps' SDK (`dist/app-runtime`) is loaded by apps from there, and tests and
 *   other tools import its modules.
 * - Native packages (ONNX Runtime, sharp, zeromq, msgpackr, mmap-io) and undici, loaded from
 *   node_modules as before.
 * - Paths: a module that finds a file next to it (`new URL("../../bin/cornserve", import.meta.url)`)
 *   finds the same file, since its `import.meta.url` is rewritten to the URL its `dist/` copy has.
 *   A module that names another entry of the bundle that way (a thread's entry module) gets the
 *   bundled copy of that entry.
 */
import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises"
import { dirname, relative, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import * as esbuild from "esbuild"

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..")
const dist = resolve(root, "dist")
const outdir = resolve(dist, "bundle")

/** The entries, by their name in the bundle: the CLI, an executor's roles, and what threads load. */
const entries = {
  cli: "cli/main.js",
  "executor-roles": "executors/common/ExecutorCommand.js",
  "early-spawn": "executors/common/EarlySpawn.js",
  "thread-pool-worker": "executors/common/ThreadPoolWorker.js",
  "llm-preprocess": "executors/llm/preprocess.js",
  "eric-preprocess": "executors/eric/preprocess.js",
  "schema-thread-worker": "control/SchemaThreadWorker.js"
}
const entryNames = new Map(Object.entries(entries).map(([name, path]) => [resolve(dist, path), name]))

const external = [
  "onnxruntime-node",
  "onnxruntime-common",
  "sharp",
  "zeromq",
  "msgpackr",
  "@riaskov/mmap-io",
  "undici",
  "typescript",
  "esbuild"
]

/** Every output is in `outdir` itself (chunks too), so one relative path serves any of them. */
const fromOutput = (file) => relative(outdir, file).split("\\").join("/")

const siblingUrl = /new URL\("(\.{1,2}\/[^"]+\.js)", import\.meta\.url\)/g

const keepPaths = {
  name: "keep-paths",
  setup(build) {
    build.onLoad({ filter: /\.js$/ }, async (args) => {
      if (!args.path.startsWith(`${dist}/`)) return undefined
      const source = await readFile(args.path, "utf8")
      if (!source.includes("import.meta.url")) return { contents: source, loader: "js" }
      // The bundle's own URL where a module names another entry; its `dist/` URL everywhere else.
      const outputUrl = "\0bundle-url\0"
      const contents = source
        .replace(siblingUrl, (whole, specifier) => {
          const name = entryNames.get(resolve(dirname(args.path), specifier))
          return name === undefined ? whole : `new URL("./${name}.js", ${outputUrl})`
        })
        .replaceAll("import.meta.url", `new URL(${JSON.stringify(fromOutput(args.path))}, import.meta.url).href`)
        .replaceAll(outputUrl, "import.meta.url")
      return { contents, loader: "js" }
    })
  }
}

/** undici and ws, for @effect/platform-node's own modules: loaded when first used (see lazy-packages.mjs). */
const lazyPackages = {
  name: "lazy-packages",
  setup(build) {
    build.onResolve({ filter: /^(ws|\.\.?\/Undici\.js)$/ }, (args) =>
      /\/@effect\/platform-node(-shared)?\//.test(args.importer)
        ? { path: resolve(root, "scripts", "lazy-packages.mjs") }
        : undefined
    )
  }
}

const result = await esbuild.build({
  entryPoints: Object.fromEntries(Object.entries(entries).map(([name, path]) => [name, resolve(dist, path)])),
  outdir,
  bundle: true,
  splitting: true,
  format: "esm",
  platform: "node",
  target: "node20",
  external,
  plugins: [keepPaths, lazyPackages],
  keepNames: true,
  chunkNames: "chunk-[hash]",
  // Packages written as CommonJS (ws, …) call require(); an ES module has none of its own.
  banner: {
    js: 'import { createRequire as __bundleRequire } from "node:module"; const require = __bundleRequire(import.meta.url);'
  },
  logLevel: "warning",
  write: false
})

/**
 * Into place without a moment when a file is missing: the platform may be running from this
 * bundle while it is rebuilt (an app folder's `npm install` of this package runs its `prepare`).
 * A file whose bytes are unchanged is left alone; a changed one is written beside it and renamed
 * over it; files no longer in the bundle go last.
 */
await mkdir(outdir, { recursive: true })
const written = new Set()
for (const file of result.outputFiles) {
  written.add(file.path)
  const current = await readFile(file.path).catch(() => undefined)
  if (current !== undefined && Buffer.compare(current, file.contents) === 0) continue
  const staging = `${file.path}.${process.pid}.tmp`
  await writeFile(staging, file.contents)
  await rename(staging, file.path)
}
for (const name of await readdir(outdir)) {
  const path = resolve(outdir, name)
  if (!written.has(path)) await rm(path, { force: true })
}
