#!/usr/bin/env node
/**
 * Runs one bench: `npm run bench -- <name>` runs bench/<name>.ts.
 *
 * TypeScript benches run without a build step: the bench is bundled with esbuild into a temporary
 * .mjs under bench/.out/ (dependencies stay external, resolved from node_modules at run time) and
 * imported. A bench module exports a default async function; it runs with the repository root as
 * working directory.
 */
import { rmSync } from "node:fs"
import { mkdir, readdir } from "node:fs/promises"
import { basename, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import * as esbuild from "esbuild"

// The benches' own ONNX Runtime sessions (and transformers.js's, the reference), and every process
// they start, run as the platform's do: without ONNX Runtime's telemetry (see
// src/executors/common/Sessions.ts).
process.env.ORT_DISABLE_TELEMETRY ??= "1"

const benchDir = fileURLToPath(new URL(".", import.meta.url))
const rootDir = fileURLToPath(new URL("..", import.meta.url))
const outDir = join(benchDir, ".out")

/** Bench names: the top-level .ts files of bench/ (helpers live in subfolders). */
async function listBenches() {
  const files = await readdir(benchDir)
  return files
    .filter((file) => file.endsWith(".ts") && !file.endsWith(".d.ts"))
    .map((file) => basename(file, ".ts"))
    .sort()
}

async function bundle(name) {
  await mkdir(outDir, { recursive: true })
  // The pid keeps two benches run at once from overwriting each other's bundle.
  const outfile = join(outDir, `${name}-${process.pid}.mjs`)
  await esbuild.build({
    entryPoints: [join(benchDir, `${name}.ts`)],
    outfile,
    bundle: true,
    packages: "external",
    platform: "node",
    format: "esm",
    target: "node20",
    sourcemap: "inline",
    logLevel: "warning"
  })
  return outfile
}

/**
 * The admin token of the platforms a bench starts and the CLI commands it runs (inherited through the
 * environment), and of its /metrics reads.
 */
process.env.CORNSERVE_ADMIN_TOKEN ||= "cornserve-bench-admin-token"

async function main(name) {
  const benches = await listBenches()
  if (name === undefined || !benches.includes(name)) {
    if (name !== undefined) console.error(`unknown bench: ${name}`)
    console.error(`usage: npm run bench -- <name>\navailable benches: ${benches.join(", ") || "(none)"}`)
    return 2
  }
  process.chdir(rootDir)
  const outfile = await bundle(name)
  // On exit rather than in a finally: a bench stopped by a signal leaves through process.exit().
  process.once("exit", () => rmSync(outfile, { force: true }))
  const bench = await import(pathToFileURL(outfile).href)
  if (typeof bench.default !== "function") throw new Error(`bench/${name}.ts has no default export to run`)
  await bench.default()
  return 0
}

main(process.argv[2]).then(
  (code) => {
    process.exitCode = code
  },
  (error) => {
    console.error(error instanceof Error ? (error.stack ?? error.message) : error)
    process.exitCode = 1
  }
)
