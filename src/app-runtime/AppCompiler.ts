import { createRequire, isBuiltin } from "node:module"
import { pathToFileURL } from "node:url"
import * as esbuild from "esbuild"

export type CompileFailure =
  | { readonly _tag: "SyntaxError"; readonly message: string }
  | { readonly _tag: "ForbiddenImport"; readonly module: string; readonly message: string }

const sdkSpecifier = "cornserve/app"
const sdkUrl = new URL("./index.js", import.meta.url).href
const policyPlugin = "cornserve-import-policy"

const require = createRequire(import.meta.url)

/** The ES module URL of a package import (module loaders without import.meta.resolve fall back to require's). */
const resolveModule = (specifier: string): string =>
  typeof import.meta.resolve === "function"
    ? import.meta.resolve(specifier)
    : pathToFileURL(require.resolve(specifier)).href

const allowedModules = 'an app may import only "cornserve/app", "effect" and Node built-ins'

/** The URL an allowed import resolves to, or why it is refused. */
const resolveAllowed = (specifier: string): { readonly url: string } | { readonly refused: string } => {
  if (specifier === sdkSpecifier) return { url: sdkUrl }
  if (isBuiltin(specifier)) return { url: specifier.startsWith("node:") ? specifier : `node:${specifier}` }
  if (specifier === "effect" || specifier.startsWith("effect/")) {
    try {
      return { url: resolveModule(specifier) }
    } catch {
      return { refused: `"${specifier}" is not a module of effect` }
    }
  }
  return { refused: `import of "${specifier}" is not allowed: ${allowedModules}` }
}

const describe = (message: esbuild.Message, file: string): string => {
  const where = message.location ? `${file}:${message.location.line}:${message.location.column + 1}: ` : ""
  return `${where}${message.text}`
}

/**
 * Turns an app's TypeScript source into one ES module. Imports may name only the SDK, `effect`
 * and Node built-ins; they resolve to the platform's own copies, so an app's tasks and schemas are
 * the very classes the platform checks against.
 */
export const compileApp = async (
  source: string,
  fileName: string
): Promise<{ readonly _tag: "Compiled"; readonly code: string } | CompileFailure> => {
  compiling++
  clearTimeout(idleStop)
  try {
    return await compile(source, fileName)
  } finally {
    compiling--
    // esbuild's helper process pings the platform every second and holds ~13 MB while it waits for
    // work that comes only when an app is registered: it goes once registrations stop.
    if (compiling === 0) idleStop = setTimeout(() => void esbuild.stop(), compilerIdleMs).unref()
  }
}

/** How long esbuild's helper process stays after the last compile. */
const compilerIdleMs = 5_000
let compiling = 0
let idleStop: NodeJS.Timeout | undefined

const compile = async (
  source: string,
  fileName: string
): Promise<{ readonly _tag: "Compiled"; readonly code: string } | CompileFailure> => {
  const forbidden: Array<string> = []
  try {
    const result = await esbuild.build({
      stdin: { contents: source, loader: "ts", sourcefile: fileName },
      bundle: true,
      write: false,
      format: "esm",
      platform: "node",
      target: "node20",
      logLevel: "silent",
      plugins: [
        {
          name: policyPlugin,
          setup(build) {
            build.onResolve({ filter: /.*/ }, (args) => {
              const resolved = resolveAllowed(args.path)
              if ("url" in resolved) return { path: resolved.url, external: true }
              forbidden.push(args.path)
              return { errors: [{ text: resolved.refused }] }
            })
          }
        }
      ]
    })
    return { _tag: "Compiled", code: result.outputFiles[0]!.text }
  } catch (error) {
    const messages: Array<esbuild.Message> = (error as esbuild.BuildFailure).errors ?? []
    if (messages.length === 0) throw error
    const text = messages.map((message) => describe(message, fileName)).join("\n")
    return forbidden.length > 0
      ? { _tag: "ForbiddenImport", module: forbidden[0]!, message: text }
      : { _tag: "SyntaxError", message: text }
  }
}

/** Stops esbuild's helper process; the next compile starts it again. */
export const stopCompiler = (): Promise<void> => {
  clearTimeout(idleStop)
  return esbuild.stop()
}
