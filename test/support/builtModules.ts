import { statSync } from "node:fs"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { repoRoot } from "./platform.js"

/**
 * The URL of a module of src/ as `npm run build` writes it into dist/, for code that runs
 * JavaScript outside vitest (a worker thread, a child process). A build older than its source
 * would test old code: that is an error, not a silent pass.
 */
export const builtModuleUrl = (source: string): string => {
  const built = join(repoRoot, "dist", source.replace(/^src\//, "").replace(/\.ts$/, ".js"))
  const builtTime = (() => {
    try {
      return statSync(built).mtimeMs
    } catch {
      return 0
    }
  })()
  if (statSync(join(repoRoot, source)).mtimeMs > builtTime)
    throw new Error(`${built} is older than ${source}: run npm run build first`)
  return pathToFileURL(built).href
}
