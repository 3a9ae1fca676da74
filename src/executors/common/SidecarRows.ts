/**
 * A consumer's read of one forwarded datum: every chunk of it, in order, each taken (copied out of
 * the arena, or refused) before it is released, as the embeddings and hidden states that
 * generators and talkers take.
 */
import { RecvTimeout } from "../../sidecar/errors.js"
import type { Payload, SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { BadRequest, EmbeddingMissing } from "./errors.js"

/**
 * Every chunk of `id` (the first `chunks` of them, when given) through `take`, which copies what it
 * keeps (the chunk's memory is the sidecar's, released once taken) or throws; EmbeddingMissing
 * when the first chunk does not come within `waitMs`.
 */
export const receiveChunks = async <T>(
  sidecar: SidecarClient,
  id: string,
  waitMs: number,
  what: string,
  take: (payload: Payload, chunk: number) => T,
  chunks = Number.POSITIVE_INFINITY
): Promise<Array<T>> => {
  const taken: Array<T> = []
  for (let chunk = 0; chunk < chunks; chunk++) {
    let payload: Payload | undefined
    try {
      payload = await sidecar.recv(id, chunk, { timeoutMs: waitMs })
    } catch (error) {
      if (chunk === 0 && error instanceof RecvTimeout)
        throw new EmbeddingMissing({ message: `${what} ${id} did not arrive within ${waitMs} ms` })
      throw error
    }
    if (payload === undefined) return taken
    try {
      taken.push(take(payload, chunk))
    } finally {
      await sidecar.markDone(id, chunk)
    }
  }
  return taken
}

/**
 * The float32 rows of `id`, [rows, width] in one chunk or several (the first `chunks`, when
 * given), joined; a chunk of another kind, or (with `width`) of another width, is a BadRequest
 * that says what was expected.
 */
export const receiveRows = async (
  sidecar: SidecarClient,
  id: string,
  waitMs: number,
  what: string,
  width?: number,
  chunks?: number
): Promise<{ readonly rows: Float32Array; readonly width: number }> => {
  let seen = width
  const parts = await receiveChunks(
    sidecar,
    id,
    waitMs,
    what,
    (payload, chunk) => {
      if (
        !(payload instanceof Tensor) ||
        payload.dtype !== "float32" ||
        payload.shape.length !== 2 ||
        (seen !== undefined && payload.shape[1] !== seen)
      )
        throw new BadRequest({
          message: `${what} ${id} chunk ${chunk} is not a float32 [rows, ${seen ?? "hidden"}] tensor${width === undefined ? "" : `: this model reads them ${width} wide`}`
        })
      seen = payload.shape[1]!
      return (payload.data as Float32Array).slice()
    },
    chunks
  )
  const rows = new Float32Array(parts.reduce((sum, part) => sum + part.length, 0))
  let at = 0
  for (const part of parts) {
    rows.set(part, at)
    at += part.length
  }
  return { rows, width: seen ?? 0 }
}
