import { randomBytes } from "node:crypto"
import { chmodSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs"
import { join } from "node:path"

/**
 * The admin token a platform made for itself, kept in its state dir (mode 0600): admin routes need
 * a token also on loopback, and when the operator sets none (CORNSERVE_ADMIN_TOKEN), `serve` makes
 * one here and the CLI on the same machine, as the same user, reads it from the same state dir. So
 * the quick start needs no token to be typed, and no other user of the machine (nor an app, which
 * runs as another user) can act as the admin.
 */

export const adminTokenPath = (stateDir: string) => join(stateDir, "admin-token")

/** The token in `stateDir`, made (and the directory, 0700) when there is none; answers it and whether it is new. */
export const ensureAdminToken = (stateDir: string): { readonly token: string; readonly created: boolean } => {
  mkdirSync(stateDir, { recursive: true, mode: 0o700 })
  const path = adminTokenPath(stateDir)
  const existing = readAdminToken(stateDir)
  if (existing !== undefined) {
    // Kept to its owner, whatever its mode was left with.
    if ((statSync(path).mode & 0o077) !== 0) chmodSync(path, 0o600)
    return { token: existing, created: false }
  }
  const token = randomBytes(32).toString("base64url")
  writeFileSync(path, `${token}\n`, { mode: 0o600, flag: "w" })
  chmodSync(path, 0o600)
  return { token, created: true }
}

/** The token in `stateDir`, or undefined when there is none (or it cannot be read by this user). */
export const readAdminToken = (stateDir: string): string | undefined => {
  try {
    const token = readFileSync(adminTokenPath(stateDir), "utf8").trim()
    return token.length > 0 ? token : undefined
  } catch {
    return undefined
  }
}
