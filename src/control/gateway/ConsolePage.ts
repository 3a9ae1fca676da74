/**
 * `/console`: the web console (the `console/` folder of the repository), built at `npm run build`
 * into `dist/console/` and served from there: its page, and the assets the build names by their
 * content's hash. Only plain file names are served, from that folder and its `assets/`, so that no
 * path leaves it; the page loads nothing from anywhere else, and its Content-Security-Policy lets its
 * scripts, styles and requests reach only the gateway.
 */
import { readFile } from "node:fs/promises"
import { extname, join } from "node:path"
import { fileURLToPath } from "node:url"

/** Where the build puts the console: beside the compiled gateway's `control/` folder. */
const consoleDir = fileURLToPath(new URL("../../console/", import.meta.url))

const contentTypes: ReadonlyMap<string, string> = new Map([
  [".html", "text/html; charset=utf-8"],
  [".js", "text/javascript; charset=utf-8"],
  [".css", "text/css; charset=utf-8"],
  [".svg", "image/svg+xml"],
  [".png", "image/png"],
  [".ico", "image/x-icon"],
  [".woff2", "font/woff2"]
])

/** A file name with no path in it: no slash, and no leading dot (so neither `..` nor a hidden file). */
const plainName = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/

export interface ConsoleFile {
  readonly body: Uint8Array
  readonly contentType: string
  readonly cacheControl: string
}

/**
 * Assets never change under their name (it is their content's hash): each is read once. The page
 * and the other top-level files are read on each request, so that a rebuild is served at once.
 */
const assets = new Map<string, ConsoleFile>()

const read = async (path: string, contentType: string, cacheControl: string): Promise<ConsoleFile | undefined> => {
  try {
    return { body: await readFile(path), contentType, cacheControl }
  } catch {
    return undefined
  }
}

/** A file of the console: `name` in its folder, or in `assets/`; undefined when there is none (or the console is not built). */
export const consoleFile = async (name: string, folder: "top" | "assets" = "top"): Promise<ConsoleFile | undefined> => {
  if (!plainName.test(name)) return undefined
  const contentType = contentTypes.get(extname(name).toLowerCase())
  if (contentType === undefined) return undefined
  if (folder === "top") return read(join(consoleDir, name), contentType, "no-cache")
  const kept = assets.get(name)
  if (kept !== undefined) return kept
  const file = await read(join(consoleDir, "assets", name), contentType, "public, max-age=31536000, immutable")
  if (file !== undefined) assets.set(name, file)
  return file
}

/**
 * What the console may load: its own scripts and styles (no inline ones), images and audio the
 * gateway answers with (as `data:` URLs, or blobs the page assembles), and requests to the gateway only.
 */
export const consoleContentSecurityPolicy =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; media-src 'self' data: blob:; connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
