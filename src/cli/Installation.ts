import { existsSync, readFileSync, realpathSync } from "node:fs"
import { createRequire } from "node:module"
import { delimiter, dirname, join, relative, resolve } from "node:path"
import { fileURLToPath } from "node:url"

/**
 * Where this installation is and what it is: a clone built in place (`npm install` in it), or the
 * package npm installed from a tarball or a registry (`npm pack`'s files: the build, the binary,
 * the examples, no sources).
 */
export const installRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..")

const require = createRequire(import.meta.url)

/** The directory of a package this installation depends on, found where Node finds it from here. */
export const packageDir = (name: string) => dirname(require.resolve(`${name}/package.json`))

/** A clone has the sources it was built from beside its build; a package ships the build alone. */
export const isSourceCheckout = (): boolean => existsSync(join(installRoot, "tsconfig.build.json"))

/** What this installation's package.json says of itself. */
export const installedManifest = (): {
  readonly version: string
  readonly dependencies: Readonly<Record<string, string>>
} => JSON.parse(readFileSync(join(installRoot, "package.json"), "utf8"))

const binPath = join(installRoot, "bin", "cornserve")

const isThisBinary = (candidate: string): boolean => {
  try {
    return realpathSync(candidate) === realpathSync(binPath)
  } catch {
    return false
  }
}

/**
 * How a user in `cwd` runs this installation's CLI, for the commands the CLI prints: `npx
 * cornserve` where it is a dependency of the project around `cwd`, `cornserve` where it is on the
 * PATH (a global install), else `node` and its path (a clone: `node bin/cornserve`).
 */
export const cliCommand = (cwd = process.cwd()): string => {
  if (!isSourceCheckout()) {
    for (let dir = resolve(cwd); ; dir = dirname(dir)) {
      if (isThisBinary(join(dir, "node_modules", ".bin", "cornserve"))) return "npx cornserve"
      if (dirname(dir) === dir) break
    }
    const onPath = (process.env.PATH ?? "").split(delimiter).filter((dir) => dir !== "")
    if (onPath.some((dir) => isThisBinary(join(dir, "cornserve")))) return "cornserve"
  }
  return `node ${relative(cwd, binPath) || binPath}`
}
