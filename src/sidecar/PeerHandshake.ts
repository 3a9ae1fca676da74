import { randomBytes, timingSafeEqual } from "node:crypto"
import { proofOf } from "../contracts/Credentials.js"
import { handshakeBytes } from "./protocol.js"

/**
 * How two sidecars show each other that they hold the cluster's internal secret before a byte of
 * data crosses: each sends a fresh random challenge, and each answers the other's with an HMAC of
 * the secret over it. The secret itself never travels, and a proof is good for one connection
 * only. A proof names who makes it, in which role, and to whom, so that one side's proof cannot be
 * played back as the other's, nor on a connection between other nodes.
 */

/** How long a connection may take to finish the handshake before it is dropped. */
export const handshakeTimeoutMs = 10_000

/** A fresh challenge. */
export const freshNonce = (): Buffer => randomBytes(handshakeBytes)

/** What the sending node (the one dialled) proves, over the receiving node's challenge. */
export const senderProof = (secret: string, receiverNonce: Uint8Array, sender: string, receiver: string): Buffer =>
  proofOf(secret, receiverNonce, JSON.stringify(["sidecar sender", sender, receiver]))

/** What the receiving node (the one that dials) proves, over the sending node's challenge. */
export const receiverProof = (secret: string, senderNonce: Uint8Array, receiver: string, sender: string): Buffer =>
  proofOf(secret, senderNonce, JSON.stringify(["sidecar receiver", receiver, sender]))

/** Whether a proof is the expected one, in constant time. */
export const sameProof = (given: Uint8Array, expected: Buffer): boolean =>
  given.length === expected.length && timingSafeEqual(given, expected)
