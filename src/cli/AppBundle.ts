import { readdirSync, readFileSync, realpathSync, statSync } from "node:fs"
import { readFile } from "node:fs/promises"
import { isBuiltin } from "node:module"
import { dirname, join, resolve, sep } from "node:path"
import * as esbuild from "esbuild"
import { type AppFolder, type BundleInput, appFolderOf, isCode, mayBundle, nameIn } from "./AppFiles.js"

/**
 * An app as the platform receives it: its source when it imports only what the platform provides
 * (`cornserve/app`, `effect`, Node built-ins), else one ES module with the npm packages it imports
 * bundled in. Packages resolve from the app file's folder, as Node resolves them there, so an app
 * folder with its own `package.json` and `npm install` works as any Node project does. The platform
 * keeps what it receives, so a restart restores the app without this machine; what it receives comes
 * from the app's folder and its packages only (see `AppFolder`).
 */
export type AppBundle =
  | {
      readonly _tag: "Bundled"
      readonly source: string
      readonly packages: ReadonlyArray<string>
      /** Every file the app is made of: its own modules, the packages' files, the data they inline. */
      readonly inputs: ReadonlyArray<BundleInput>
    }
  | { readonly _tag: "Refused"; readonly message: string }

/** What the platform provides to every app: never bundled, always its own copies. */
const provided = (specifier: string) =>
  specifier === "cornserve/app" || specifier === "effect" || specifier.startsWith("effect/") || isBuiltin(specifier)

/**
 * Dependencies by which a package builds or fetches a native addon: such a package cannot load in
 * an app's process (the sandbox refuses native addons), so it is refused when the app is bundled.
 */
const nativeAddonTools = new Set([
  "bindings",
  "node-gyp-build",
  "node-gyp",
  "prebuild-install",
  "@mapbox/node-pre-gyp",
  "node-pre-gyp",
  "node-addon-api",
  "nan",
  "cmake-js"
])

/** The package a file of node_modules belongs to (`name` or `@scope/name`), or undefined. */
const packageOf = (path: string): { readonly name: string; readonly dir: string } | undefined => {
  const parts = path.split(/[\\/]/)
  const at = parts.lastIndexOf("node_modules")
  if (at === -1 || at + 1 >= parts.length) return undefined
  const scoped = parts[at + 1]!.startsWith("@")
  const nameParts = parts.slice(at + 1, at + (scoped ? 3 : 2))
  return { name: nameParts.join("/"), dir: parts.slice(0, at + 1 + nameParts.length).join(sep) }
}

/** Packages of prebuilt native binaries for one platform (`@img/sharp-linux-x64`, `esbuild-linux-64`). */
const platformBinaryPackage = /-(?:linux|darwin|win32|freebsd|android|sunos)(?:-|$)/

/** Whether `dir` holds a compiled addon (`*.node`) or an addon's build file, within a few levels. */
const holdsAddon = (dir: string, depth = 4): boolean => {
  let entries: Array<import("node:fs").Dirent>
  try {
    entries = readdirSync(dir, { withFileTypes: true })
  } catch {
    return false
  }
  return entries.some((entry) =>
    entry.isDirectory()
      ? depth > 0 && entry.name !== "node_modules" && holdsAddon(join(dir, entry.name), depth - 1)
      : entry.name.endsWith(".node") || entry.name === "binding.gyp"
  )
}

/** Why a package needs a native addon, or undefined when it is pure JavaScript. */
const nativeAddonReason = (dir: string): string | undefined => {
  let manifest: {
    gypfile?: unknown
    binary?: unknown
    dependencies?: Record<string, string>
    optionalDependencies?: Record<string, string>
  }
  try {
    manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))
  } catch {
    return undefined
  }
  if (manifest.gypfile === true) return "it builds a native addon (gypfile)"
  if (manifest.binary !== undefined) return "it downloads a native addon (binary)"
  const dependencies = [
    ...Object.keys(manifest.dependencies ?? {}),
    ...Object.keys(manifest.optionalDependencies ?? {})
  ]
  const tool = dependencies.find((name) => nativeAddonTools.has(name))
  if (tool !== undefined) return `it loads a native addon (it depends on ${tool})`
  const prebuilt = dependencies.find((name) => platformBinaryPackage.test(name))
  if (prebuilt !== undefined) return `it loads a prebuilt native addon (${prebuilt})`
  if (holdsAddon(dir)) return "it ships a native addon (a .node file)"
  return undefined
}

/**
 * CommonJS packages call `require` for Node's built-ins; an ES module has none, so the bundle makes
 * one. The app's module is loaded from a data: URL, so it is made from an absolute path instead of
 * `import.meta.url`; the sandbox lets it load built-ins only.
 */
const requireShim =
  'import { createRequire as __cornserveCreateRequire } from "node:module";\nconst require = __cornserveCreateRequire("/app.js");\n'

/** Keeps what the platform provides out of the bundle, and refuses native addons by their package. */
const providedPlugin: esbuild.Plugin = {
  name: "cornserve-provided",
  setup(build) {
    build.onResolve({ filter: /.*/ }, (args) =>
      args.kind !== "entry-point" && provided(args.path) ? { path: args.path, external: true } : undefined
    )
    build.onLoad({ filter: /\.node$/ }, (args) => {
      const owner = packageOf(args.path)?.name ?? args.path
      return { errors: [{ text: `package "${owner}" needs a native addon (${args.path}), which apps cannot load` }] }
    })
  }
}

/** Marks esbuild's own resolution, asked from within the plugin, so that the plugin does not judge it twice. */
const resolving = Symbol("cornserve-resolving")

/** A file outside the app's folder becomes an empty module here: it is never read. */
const outsideNamespace = "cornserve-outside"

/**
 * Resolves every import as esbuild would, then judges the file it names by its real path: one of
 * the app's folder or its packages is taken (and noted in `taken`, as code or data), any other is
 * noted in `outside` with its importer and never read, so that the build goes on and every such
 * file is reported at once.
 */
const appFilesPlugin = (
  folder: AppFolder,
  taken: Map<string, { readonly code: boolean }>,
  outside: Map<string, Set<string>>
): esbuild.Plugin => ({
  name: "cornserve-app-files",
  setup(build) {
    build.onResolve({ filter: /.*/ }, async (args) => {
      if (args.pluginData === resolving) return undefined
      const resolved = await build.resolve(args.path, {
        kind: args.kind,
        importer: args.importer,
        namespace: args.namespace,
        resolveDir: args.resolveDir,
        with: args.with,
        pluginData: resolving
      })
      // Said where the import is; never left to a resolution the plugin does not judge.
      if (resolved.errors.length > 0) return { errors: resolved.errors }
      if (resolved.external || resolved.namespace !== "file") {
        return { path: resolved.path, external: resolved.external, namespace: resolved.namespace }
      }
      const real = realpathSync(resolved.path)
      // The app's own file is the one its author named, wherever a link to it leads.
      if (args.kind !== "entry-point" && !mayBundle(folder, real)) {
        outside.set(real, (outside.get(real) ?? new Set()).add(args.importer))
        return { path: real, namespace: outsideNamespace }
      }
      const code = isCode(real, args.with)
      taken.set(real, { code: code && (taken.get(real)?.code ?? true) })
      return { path: resolved.path, sideEffects: resolved.sideEffects, suffix: resolved.suffix }
    })
    build.onLoad({ filter: /.*/, namespace: outsideNamespace }, () => ({ contents: "", loader: "empty" }))
  }
})

const buildMessage = (message: esbuild.Message) =>
  message.location === null
    ? message.text
    : `${message.location.file}:${message.location.line}:${message.location.column + 1}: ${message.text}`

export const bundleApp = async (file: string): Promise<AppBundle> => {
  const path = resolve(file)
  const source = await readFile(path, "utf8")
  const folder = appFolderOf(dirname(path))
  const taken = new Map<string, { readonly code: boolean }>()
  // Each file outside the app's folder, with the files that import it.
  const outside = new Map<string, Set<string>>()
  let result: esbuild.BuildResult | undefined
  let buildErrors: Array<esbuild.Message> = []
  try {
    result = await esbuild.build({
      entryPoints: [path],
      absWorkingDir: dirname(path),
      bundle: true,
      write: false,
      format: "esm",
      platform: "node",
      target: "node20",
      logLevel: "silent",
      banner: { js: requireShim },
      plugins: [providedPlugin, appFilesPlugin(folder, taken, outside)]
    })
  } catch (error) {
    buildErrors = (error as esbuild.BuildFailure).errors ?? []
    if (buildErrors.length === 0) throw error
  } finally {
    await esbuild.stop()
  }
  const packages = new Map<string, string>()
  for (const input of [...taken.keys(), ...outside.keys()]) {
    const owner = packageOf(input)
    if (owner !== undefined) packages.set(owner.name, owner.dir)
  }
  const problems = buildErrors.map(buildMessage)
  for (const [name, dir] of packages) {
    const reason = nativeAddonReason(dir)
    if (reason !== undefined)
      problems.push(`package "${name}" cannot run in an app: ${reason}; apps run pure JavaScript only`)
  }
  for (const [outsider, importers] of outside) {
    const names = [...importers].map((importer) => nameIn(folder, importer))
    problems.push(
      `${outsider} (imported by ${names.join(", ")}) is outside the app's folder (${folder.dir}) and its ` +
        "node_modules: an app bundles only the files of its folder and the packages installed for it"
    )
  }
  if (problems.length > 0 || result === undefined) return { _tag: "Refused", message: problems.join("\n") }
  const inputs = [...taken]
    .map(([input, { code }]) => ({ path: input, name: nameIn(folder, input), bytes: statSync(input).size, code }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
  // An app of its own file alone goes as it was written: the platform shows and keeps its source.
  if (inputs.length === 1) return { _tag: "Bundled", source, packages: [], inputs }
  return {
    _tag: "Bundled",
    source: result.outputFiles![0]!.text,
    packages: [...packages.keys()].sort(),
    inputs
  }
}
