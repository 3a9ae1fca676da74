import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  writeFileSync
} from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { isRunning } from "../../node/AbandonedFiles.js"

/**
 * The files an app's process loads: the process's entry (the driver's worker), the SDK (the app
 * runtime) and the packages it and the app import (`effect` and what `effect` depends on).
 */
export interface AppRuntimeFiles {
  /** The script the app's process runs. */
  readonly hostEntry: string
  /** The directories the process may read (Node's permission model), each ending with `/`. */
  readonly readableDirs: ReadonlyArray<string>
  /** The app's compiled code with its imports of the runtime pointing at these files. */
  relocate(code: string): string
}

/** A directory of the runtime, by its real path: the permission model checks files after links are resolved. */
interface RuntimeDir {
  readonly path: string
  /** Where it goes in a copy, relative to the copy's root. */
  readonly copyAs: string
}

const appRuntimeDir = realpathSync(fileURLToPath(new URL("../../app-runtime/", import.meta.url)))
const workerInRuntime = join("driver", "worker.js")

/** The runtime's directories where the platform is installed. */
const runtimeDirs = (): ReadonlyArray<RuntimeDir> => [
  { path: appRuntimeDir, copyAs: "app-runtime" },
  ...packageClosure(dirname(createRequire(import.meta.url).resolve("effect/package.json"))).map((dir) => ({
    path: realpathSync(dir),
    copyAs: join("node_modules", packageName(dir))
  }))
]

const packageName = (dir: string): string =>
  (JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { name: string }).name

/** A package's directory and those of everything it depends on, found where Node would find them. */
const packageClosure = (packageDir: string): ReadonlyArray<string> => {
  const found = new Set<string>()
  const visit = (dir: string) => {
    if (found.has(dir) || !existsSync(join(dir, "package.json"))) return
    found.add(dir)
    const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as {
      readonly dependencies?: Readonly<Record<string, string>>
    }
    for (const name of Object.keys(manifest.dependencies ?? {})) {
      // Node's lookup: the node_modules of the dependent's directory, then of each directory above it.
      for (let ancestor = dir; ; ancestor = dirname(ancestor)) {
        const candidate = join(ancestor, "node_modules", name)
        if (existsSync(candidate)) {
          visit(candidate)
          break
        }
        if (dirname(ancestor) === ancestor) break
      }
    }
  }
  visit(packageDir)
  return [...found]
}

/** The runtime where the platform is installed: the app's code already imports these files. */
export const installedRuntime = (): AppRuntimeFiles => ({
  hostEntry: join(appRuntimeDir, workerInRuntime),
  readableDirs: runtimeDirs().map((dir) => `${dir.path}/`),
  relocate: (code) => code
})

/**
 * A copy of the runtime in a new directory that every user may read, for an app's process whose
 * user cannot read where the platform is installed (a checkout in a home directory that others may
 * not enter, files without read permission for others). It mirrors an installation's layout, so
 * that the SDK finds `effect` by Node's own lookup, and it is removed when the platform exits (or,
 * after a platform was killed, by the next one to make a copy).
 */
export const copiedRuntime = (): AppRuntimeFiles => {
  removeAbandonedCopies()
  const root = mkdtempSync(join(tmpdir(), `${copyPrefix}${process.pid}-`))
  process.once("exit", () => rmSync(root, { recursive: true, force: true }))
  const dirs = runtimeDirs()
  for (const dir of dirs) {
    mkdirSync(dirname(join(root, dir.copyAs)), { recursive: true })
    cpSync(dir.path, join(root, dir.copyAs), { recursive: true, dereference: true })
  }
  // The SDK's files are ES modules by the platform's own package.json, which the copy lacks.
  writeFileSync(join(root, "package.json"), JSON.stringify({ type: "module", private: true }))
  openToAll(root)
  const moves = dirs.map((dir) => ({
    from: `${pathToFileURL(dir.path).href}/`,
    to: `${pathToFileURL(join(root, dir.copyAs)).href}/`
  }))
  return {
    hostEntry: join(root, "app-runtime", workerInRuntime),
    readableDirs: dirs.map((dir) => `${join(root, dir.copyAs)}/`),
    relocate: (code) => moves.reduce((moved, { from, to }) => moved.replaceAll(from, to), code)
  }
}

/** A copy's name: the prefix, the pid of the platform that made it, a random part. */
const copyPrefix = "cornserve-app-runtime-"

const removeAbandonedCopies = () => {
  for (const name of readdirSync(tmpdir())) {
    const pid = name.startsWith(copyPrefix) ? Number(name.slice(copyPrefix.length).split("-")[0]) : Number.NaN
    if (Number.isSafeInteger(pid) && pid > 0 && !isRunning(pid))
      rmSync(join(tmpdir(), name), { recursive: true, force: true })
  }
}

/** Every directory of the tree enterable and readable by all, every file readable by all; none writable but by its owner. */
const openToAll = (path: string) => {
  chmodSync(path, 0o755)
  for (const entry of readdirSync(path, { withFileTypes: true })) {
    const child = join(path, entry.name)
    if (entry.isDirectory()) openToAll(child)
    else chmodSync(child, 0o644)
  }
}
