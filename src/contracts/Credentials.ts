import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto"

/**
 * The platform's secrets on the wire. Every port a stranger may reach checks one of these before it
 * parses more than a bounded header:
 * - the cluster token (CORNSERVE_CLUSTER_TOKEN) on the cluster port and each node's `/rpc`,
 * - the internal secret on executors' routes and in sidecar peers' handshakes: derived from the
 *   cluster token on a cluster (every node derives the same one and none sends the token itself),
 *   random per `serve` on one machine,
 * - the admin token on the gateway's admin routes.
 * Each travels as `authorization: Bearer …` over HTTP.
 */

/** Constant-time comparison, so that a wrong secret's timing tells nothing of the right one. */
export const sameSecret = (given: string, expected: string): boolean => {
  const a = Buffer.from(given)
  const b = Buffer.from(expected)
  return a.length === b.length && timingSafeEqual(a, b)
}

/** The bearer token of an `authorization` header, or undefined. */
export const bearerOf = (header: string | ReadonlyArray<string> | undefined): string | undefined => {
  if (typeof header !== "string") return undefined
  const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header)
  return match === null ? undefined : match[1]
}

/** Whether a request's `authorization` header carries `expected`. */
export const carriesSecret = (header: string | ReadonlyArray<string> | undefined, expected: string): boolean => {
  const given = bearerOf(header)
  return given !== undefined && sameSecret(given, expected)
}

/** How an API key is kept (in the state dir, in memory): its SHA-256, never the key. */
export const keyDigest = (key: string): string => createHash("sha256").update(key).digest("hex")

/** A fresh random secret, URL-safe. */
export const freshSecret = (): string => randomBytes(32).toString("base64url")

/** The internal secret of a cluster: the same on every node holding `clusterToken`, and not the token. */
export const internalSecretOf = (clusterToken: string | undefined): string =>
  clusterToken === undefined
    ? freshSecret()
    : createHmac("sha256", clusterToken).update("cornserve internal secret v1").digest("base64url")

/** An HMAC proof of `secret` over a challenge, as a peer answers it (the secret itself never travels). */
export const proofOf = (secret: string, challenge: Uint8Array, who: string): Buffer =>
  createHmac("sha256", secret).update(who).update("\0").update(challenge).digest()
