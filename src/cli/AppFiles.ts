import { existsSync, realpathSync } from "node:fs"
import { dirname, extname, isAbsolute, join, relative, sep } from "node:path"

/**
 * Where the files of an app's bundle may come from: the app's folder, and the `node_modules`
 * folders Node resolves its packages from (its own and its parent folders', as a monorepo hoists
 * them). Whatever the platform receives it keeps and may serve back to whoever calls the app, so a
 * file from elsewhere on the author's machine (a key, a credential), named by a package through an
 * absolute path, `..` or a symlink, is never bundled. Paths are compared as real paths.
 */
export interface AppFolder {
  /** The app's folder, as its author names it. */
  readonly dir: string
  /** The real paths files may lie under. */
  readonly roots: ReadonlyArray<string>
}

const ancestors = (dir: string): Array<string> => {
  const found = [dir]
  for (let parent = dirname(dir); parent !== found[found.length - 1]; parent = dirname(parent)) found.push(parent)
  return found
}

export const appFolderOf = (dir: string): AppFolder => {
  const real = realpathSync(dir)
  const roots = new Set([real])
  for (const folder of new Set([...ancestors(dir), ...ancestors(real)])) {
    const modules = join(folder, "node_modules")
    if (existsSync(modules)) roots.add(realpathSync(modules))
  }
  return { dir, roots: [...roots] }
}

/** Whether `path` is `root` or lies below it (both absolute and normalised). */
export const isWithin = (root: string, path: string): boolean => {
  const rest = relative(root, path)
  return rest === "" || (rest !== ".." && !rest.startsWith(`..${sep}`) && !isAbsolute(rest))
}

/** Whether a file, by its real path, may go into the app's bundle. */
export const mayBundle = (folder: AppFolder, realPath: string): boolean =>
  folder.roots.some((root) => isWithin(root, realPath))

/** How the author knows a file: relative to the app's folder inside it, else its absolute path. */
export const nameIn = (folder: AppFolder, path: string): string => {
  const inside = [folder.dir, ...folder.roots.slice(0, 1)].find((root) => isWithin(root, path))
  return inside === undefined ? path : relative(inside, path)
}

const codeExtensions = new Set([".js", ".mjs", ".cjs", ".jsx", ".ts", ".mts", ".cts", ".tsx"])

/**
 * Whether a file goes into the bundle as code: a JavaScript or TypeScript file imported as a module,
 * not as data (`with { type: "text" }`, JSON, any other file a loader inlines).
 */
export const isCode = (path: string, attributes: Readonly<Record<string, string>>): boolean =>
  attributes.type === undefined && codeExtensions.has(extname(path).toLowerCase())

/** One file of a bundle, as the CLI tells its author about it. */
export interface BundleInput {
  /** Its absolute path. */
  readonly path: string
  /** Its name for the author (see `nameIn`). */
  readonly name: string
  readonly bytes: number
  /** Whether it went in as code (see `isCode`); else its content is inlined as data. */
  readonly code: boolean
}

/** The line that names a bundle's data files, or undefined when it holds only code. */
export const dataFilesLine = (inputs: ReadonlyArray<BundleInput>): string | undefined => {
  const data = inputs.filter((input) => !input.code)
  if (data.length === 0) return undefined
  return `bundled ${data.length} non-JavaScript file${data.length === 1 ? "" : "s"}: ${data.map((input) => input.name).join(", ")}`
}

/** What a registration would send, for `app register --dry-run`: each file with its size, then the total. */
export const inputListing = (inputs: ReadonlyArray<BundleInput>, bundleBytes: number): string => {
  const total = inputs.reduce((sum, input) => sum + input.bytes, 0)
  const width = String(total).length
  const rows = inputs.map((input) => `  ${String(input.bytes).padStart(width)}  ${input.name}`)
  const packed = inputs.length === 1 ? "sent as it is" : `bundled into ${bundleBytes} bytes`
  return [
    `${inputs.length} file${inputs.length === 1 ? "" : "s"} (bytes, name):`,
    ...rows,
    `  ${String(total).padStart(width)}  in all, ${packed}`
  ].join("\n")
}
