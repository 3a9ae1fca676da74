import { readFileSync } from "node:fs"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { join } from "node:path"
import { repoRoot } from "./platform.js"

/** The fields of a package-lock.json entry that a registry's version document has too. */
const manifestFields = [
  "dependencies",
  "optionalDependencies",
  "peerDependencies",
  "peerDependenciesMeta",
  "bin",
  "engines",
  "os",
  "cpu",
  "libc",
  "hasInstallScript"
] as const

interface LockEntry {
  readonly name?: string
  readonly version?: string
  readonly integrity?: string
  readonly link?: boolean
  readonly [field: string]: unknown
}

interface Packument {
  readonly name: string
  readonly "dist-tags": { latest: string }
  readonly versions: Record<string, Record<string, unknown>>
}

/** The registry's documents of every package the project's lockfile holds, at the versions it holds. */
const lockedPackuments = (): Map<string, Packument> => {
  const lock = JSON.parse(readFileSync(join(repoRoot, "package-lock.json"), "utf8")) as {
    readonly packages: Readonly<Record<string, LockEntry>>
  }
  const packuments = new Map<string, Packument>()
  for (const [path, entry] of Object.entries(lock.packages)) {
    if (path === "" || entry.link === true || entry.version === undefined) continue
    const name = entry.name ?? path.slice(path.lastIndexOf("node_modules/") + "node_modules/".length)
    const manifest: Record<string, unknown> = { name, version: entry.version }
    for (const field of manifestFields) if (entry[field] !== undefined) manifest[field] = entry[field]
    // The registry's own tarball address: the one under which npm's cache holds the tarball.
    manifest.dist = {
      tarball: `https://registry.npmjs.org/${name}/-/${name.split("/").at(-1)}-${entry.version}.tgz`,
      ...(entry.integrity === undefined ? {} : { integrity: entry.integrity })
    }
    const packument = packuments.get(name) ?? { name, "dist-tags": { latest: entry.version }, versions: {} }
    packument.versions[entry.version] = manifest
    // Latest is the version the project's tree has at its top, which npm prefers where it fits.
    if (path === `node_modules/${name}`) packument["dist-tags"].latest = entry.version
    packuments.set(name, packument)
  }
  return packuments
}

export interface LockRegistry {
  /** npm's arguments for an install that resolves against this registry and fetches from npm's cache. */
  readonly npmArgs: ReadonlyArray<string>
  close(): Promise<void>
}

/**
 * A registry on localhost that answers npm's metadata requests with the packages and versions of
 * the project's package-lock.json, and whose tarballs are where the project's own `npm install`
 * left them: in npm's cache, under the public registry's addresses. An install of the packed
 * tarball against it resolves its dependencies as an install from the public registry would, to
 * the versions the project is tested with, and reaches no other machine. (npm resolves a new
 * dependency from the registry's full documents, which an install from a lockfile does not
 * cache: `npm install --offline` of a tarball fails on a fresh CI machine.) Its answers are not
 * cached.
 */
export const startLockRegistry = async (): Promise<LockRegistry> => {
  const packuments = lockedPackuments()
  const server = createServer((request, response) => {
    const packument = packuments.get(decodeURIComponent((request.url ?? "/").slice(1)))
    response.writeHead(packument === undefined ? 404 : 200, {
      "content-type": "application/json",
      "cache-control": "no-store"
    })
    response.end(JSON.stringify(packument ?? { error: "not found" }))
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const { port } = server.address() as AddressInfo
  return {
    npmArgs: [`--registry=http://127.0.0.1:${port}/`, "--replace-registry-host=never", "--prefer-offline"],
    close: () => new Promise((resolve) => server.close(() => resolve()))
  }
}
