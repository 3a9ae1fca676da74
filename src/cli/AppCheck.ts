import { createHash } from "node:crypto"
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs"
import { homedir } from "node:os"
import { dirname, join, relative, resolve } from "node:path"
import { installRoot, packageDir } from "./Installation.js"

/** What `app check` reports: `file:line:col: error TSnnnn: message`, one per problem; empty when the app type-checks. */
export interface CheckResult {
  readonly errors: ReadonlyArray<string>
}

/**
 * Type-checks an app file as the platform will run it: strict TypeScript, `cornserve/app` as this
 * installation's SDK declarations, `effect` and Node's types as the platform has them (unless the
 * app's folder installs its own), npm packages from the app's folder. Nothing is emitted.
 */
export const checkApp = async (file: string): Promise<CheckResult> => {
  const ts = (await import("typescript")).default
  const path = resolve(file)
  const sdk = join(installRoot, "dist", "app-runtime", "index.d.ts")
  const effectDir = packageDir("effect")
  const nodeTypes = packageDir("@types/node")
  const options: import("typescript").CompilerOptions = {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    allowImportingTsExtensions: true,
    esModuleInterop: true,
    skipLibCheck: true,
    types: ["node"],
    typeRoots: [dirname(nodeTypes)],
    baseUrl: dirname(path),
    paths: {
      "cornserve/app": [sdk],
      // The app's folder may install its own effect; else the platform's.
      ...(existsSync(join(dirname(path), "node_modules", "effect"))
        ? {}
        : { effect: [effectDir], "effect/*": [join(effectDir, "dist", "dts", "*")] })
    }
  }
  const program = ts.createProgram([path], options)
  const diagnostics = ts.getPreEmitDiagnostics(program)
  const cwd = process.cwd()
  return {
    errors: diagnostics
      .filter((diagnostic) => diagnostic.category === ts.DiagnosticCategory.Error)
      .map((diagnostic) => {
        const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n  ")
        if (diagnostic.file === undefined || diagnostic.start === undefined)
          return `error TS${diagnostic.code}: ${message}`
        const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start)
        const nearby = relative(cwd, diagnostic.file.fileName)
        const where = nearby === "" || nearby.startsWith("..") ? diagnostic.file.fileName : nearby
        return `${where}:${line + 1}:${character + 1}: error TS${diagnostic.code}: ${message}`
      })
  }
}

/** Where clean checks are remembered: an app registered again unchanged is not checked again. */
const checkCacheDir = () => join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "cornserve", "app-checks")

/**
 * What a check's outcome depends on: every file the app is made of (its modules, its packages'
 * files) and the declarations it is checked against (this installation's SDK, effect, TypeScript).
 */
const checkKey = (inputs: ReadonlyArray<string>): string => {
  const hash = createHash("sha256")
  const sdk = join(installRoot, "dist", "app-runtime")
  for (const stamp of [
    join(sdk, "index.d.ts"),
    join(packageDir("effect"), "package.json"),
    join(packageDir("typescript"), "package.json")
  ]) {
    const { mtimeMs, size } = statSync(stamp)
    hash.update(`${stamp}\0${mtimeMs}\0${size}\0`)
  }
  for (const input of [...inputs].sort()) hash.update(`${input}\0`).update(readFileSync(input)).update("\0")
  return hash.digest("hex")
}

/**
 * `checkApp` for a registration: an app whose files are the same as at a clean check before (see
 * `checkKey`) is not checked again, which takes seconds; only clean checks are remembered.
 */
export const checkAppOnce = async (file: string, inputs: ReadonlyArray<string>): Promise<CheckResult> => {
  let key: string | undefined
  try {
    key = checkKey(inputs)
    if (existsSync(join(checkCacheDir(), key))) return { errors: [] }
  } catch {
    key = undefined
  }
  const result = await checkApp(file)
  if (result.errors.length === 0 && key !== undefined) {
    try {
      mkdirSync(checkCacheDir(), { recursive: true })
      writeFileSync(join(checkCacheDir(), key), "")
    } catch {
      // A cache that cannot be written only costs the next check its time.
    }
  }
  return result
}
