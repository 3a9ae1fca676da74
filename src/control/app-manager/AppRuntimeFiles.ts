import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  lstatSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  writeFileSync
} from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve, sep } from "node:path"
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
  /**
   * The symbolic links Node's resolver passes on its way to them, which it checks by their own
   * names (`linksOn`): a node_modules that is a link to another checkout's, a pnpm store's links.
   */
  readonly readableLinks: ReadonlyArray<string>
  /** The app's compiled code with its imports of the runtime pointing at these files. */
  relocate(code: string): string
}

/** A directory of the runtime, by its real path: the permission model checks files after links are resolved. */
interface RuntimeDir {
  readonly path: string
  /** Where it goes in a copy, relative to the copy's root. */
  readonly copyAs: string
}

/** The runtime's directories, and the links Node's resolver passes on its way to them. */
export interface RuntimeLayout {
  readonly dirs: ReadonlyArray<RuntimeDir>
  /** See `AppRuntimeFiles.readableLinks`. */
  readonly links: ReadonlyArray<string>
}

const appRuntimeDir = realpathSync(fileURLToPath(new URL("../../app-runtime/", import.meta.url)))
const workerInRuntime = join("driver", "worker.js")

/**
 * The directories an SDK at `sdkDir` loads: its own, and those of `effect` and of everything
 * `effect` depends on, each found as Node finds it (from the real directory of the module that
 * imports it), with the links on the way.
 */
export const runtimeLayout = (sdkDir: string): RuntimeLayout => {
  const dirs: Array<RuntimeDir> = [{ path: sdkDir, copyAs: "app-runtime" }]
  const links = new Set<string>()
  const found = new Set<string>()
  const visit = (importer: string, name: string) => {
    const at = lookUp(importer, name)
    if (at === undefined) return
    for (const link of linksOn(at)) links.add(link)
    const real = realpathSync(at)
    if (found.has(real)) return
    found.add(real)
    const manifest = JSON.parse(readFileSync(join(real, "package.json"), "utf8")) as {
      readonly name: string
      readonly dependencies?: Readonly<Record<string, string>>
    }
    dirs.push({ path: real, copyAs: join("node_modules", manifest.name) })
    for (const dependency of Object.keys(manifest.dependencies ?? {})) visit(real, dependency)
  }
  visit(sdkDir, "effect")
  return { dirs, links: [...links] }
}

/** Where Node's lookup finds package `name` for a module in `dir`: the node_modules of `dir`, then of each directory above it. */
const lookUp = (dir: string, name: string): string | undefined => {
  for (let ancestor = dir; ; ancestor = dirname(ancestor)) {
    const candidate = join(ancestor, "node_modules", name)
    if (existsSync(join(candidate, "package.json"))) return candidate
    if (dirname(ancestor) === ancestor) return undefined
  }
}

/** More links than this on one path is a loop (the kernel's own bound, ELOOP, is 40). */
const maxLinks = 40

/**
 * The symbolic links that resolving `path` to its real path passes, each by the name it has where
 * it is met: Node's realpath, which its module resolver calls, resolves a link and walks on from its
 * target, and it is the link's own name that the permission model checks there (a node_modules that
 * is a link to another checkout's; a pnpm store, where every package is a link).
 */
export const linksOn = (path: string): ReadonlyArray<string> => {
  const links: Array<string> = []
  const parts = (at: string) => at.split(sep).filter((part) => part !== "")
  let rest = parts(path)
  let at: string = sep
  while (rest.length > 0 && links.length <= maxLinks) {
    const next = join(at, rest[0]!)
    if (lstatSync(next).isSymbolicLink()) {
      links.push(next)
      rest = [...parts(resolve(at, readlinkSync(next))), ...rest.slice(1)]
      at = sep
    } else {
      at = next
      rest = rest.slice(1)
    }
  }
  return links
}

/**
 * Whether a link may be named to the permission model: the model takes a name as a prefix, so that
 * the app may read all that lies below it by that name. A link in a node_modules (the node_modules
 * itself, or a package in it) opens packages; any other (a home directory that is a link on the way
 * to another checkout's node_modules) would open much more.
 */
const opensPackagesOnly = (link: string): boolean => link.split(sep).includes("node_modules")

/**
 * The runtime where the platform is installed: the app's code already imports these files.
 * Undefined where a link on the way to them may not be named (`opensPackagesOnly`): apps then load
 * a copy.
 */
export const installedRuntime = (sdkDir = appRuntimeDir): AppRuntimeFiles | undefined => {
  const { dirs, links } = runtimeLayout(sdkDir)
  if (!links.every(opensPackagesOnly)) return undefined
  return {
    hostEntry: join(sdkDir, workerInRuntime),
    readableDirs: dirs.map((dir) => `${dir.path}/`),
    readableLinks: links,
    relocate: (code) => code
  }
}

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
  const { dirs } = runtimeLayout(appRuntimeDir)
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
    // The copy's files are copies, not links.
    readableLinks: [],
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
