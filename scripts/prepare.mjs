#!/usr/bin/env node
// npm's `prepare` and `prepack`: builds the package unless its build is newer than every file it is
// built from. `npm install` on a fresh clone builds; `npm pack` builds what it packs, and finds a
// fresh build current; an app folder's `npm install` (whose package.json depends on a clone by a
// `file:` path, as `cornserve init` writes it there) runs this too, and finds the build current
// rather than rebuilding it (a minute or more on two cores) under a platform that may be running
// from it. A packed package ships its build without its sources: there is nothing to build.
// `--stamp`, the last step of `npm run build`, records a finished build. What this says goes to
// stderr, so that `npm pack --json` prints JSON alone.
import { spawnSync } from "node:child_process"
import { existsSync, mkdirSync, readdirSync, statSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const stampPath = join(root, "dist", ".build-stamp")

if (!existsSync(join(root, "tsconfig.build.json"))) process.exit(0)

if (process.argv.includes("--stamp")) {
  mkdirSync(join(root, "dist"), { recursive: true })
  writeFileSync(stampPath, `${new Date().toISOString()}\n`)
  process.exit(0)
}

/** What the build reads: sources, the console, the build's own scripts and settings. */
const inputs = ["src", "console", "package.json", "tsconfig.json", "tsconfig.build.json"].concat(
  ["bundle.mjs", "lazy-packages.mjs", "prepare.mjs"].map((name) => join("scripts", name))
)
const skipped = new Set(["node_modules", "dist"])

/** The newest modification time below `path` (ms), or 0 for nothing there. */
const newest = (path) => {
  let stat
  try {
    stat = statSync(path)
  } catch {
    return 0
  }
  if (!stat.isDirectory()) return stat.mtimeMs
  let latest = stat.mtimeMs
  for (const entry of readdirSync(path)) {
    if (!skipped.has(entry)) latest = Math.max(latest, newest(join(path, entry)))
  }
  return latest
}

const builtAt = (() => {
  try {
    return statSync(stampPath).mtimeMs
  } catch {
    return undefined
  }
})()
const sourcesAt = Math.max(...inputs.map((input) => newest(join(root, input))))
if (builtAt !== undefined && builtAt >= sourcesAt) {
  console.error("cornserve: the build is current; not rebuilding (npm run build forces it)")
  process.exit(0)
}
const build = spawnSync(process.platform === "win32" ? "npm.cmd" : "npm", ["run", "build"], {
  cwd: root,
  stdio: ["inherit", process.stderr, process.stderr]
})
process.exit(build.status ?? 1)
