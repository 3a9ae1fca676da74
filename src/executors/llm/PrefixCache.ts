/**
 * Prefix caching: the KV cache of prompts' leading tokens, kept in blocks after their requests
 * end, so that a request whose prompt begins the same way (a system prompt, the earlier turns of a
 * chat) is prefilled from where the cached part ends.
 *
 * A block holds `blockTokens` positions of every cache tensor. It is keyed by a digest chained
 * over the prompt from its start: the digest of the block before it, its token ids, and the
 * content of each media item whose rows begin in it (its kind, shape, grid and values), so that a
 * block is found only behind the exact same tokens and media, and two images behind the same
 * placeholder tokens never match. Only whole blocks are cached: a prompt's when it is prefilled,
 * and, when its request finishes, those of the prompt and the tokens generated after it, which
 * the next turn of a chat begins with.
 *
 * The blocks are held within `maxBytes`, least recently used first out. A hit touches its blocks
 * from the last to the first, so that a chain is evicted from its end and its head, which other
 * prompts are likelier to share, stays longest.
 *
 * The cache is shared by every request the executor serves, whichever app sent it: a prompt can
 * only find blocks of the same tokens and media, and gets its own copy of them, so no other request's
 * content reaches it; what another tenant can observe is timing (a cached prefix answers its first
 * token sooner).
 */
import { createHash } from "node:crypto"
import type { CacheArray, PastData } from "./PastCache.js"
import type { MediaInput, PrefixCacheStats, PromptInput } from "./protocol.js"

export interface PrefixCacheGeometry {
  /** Cache tensors (a key and a value per layer), each [batch, heads, width, headDim]. */
  readonly tensors: number
  readonly heads: number
  readonly headDim: number
  /** float16 caches are held as their bit patterns. */
  readonly half: boolean
}

/** A digest of a media item's content: what the model is given for it. */
const mediaDigest = (input: MediaInput): Buffer => {
  const hash = createHash("sha256")
  hash.update(input.kind)
  hash.update(JSON.stringify(input.shape))
  if (input.kind === "pixel_values" && input.thw !== undefined) hash.update(JSON.stringify(input.thw))
  hash.update(new Uint8Array(input.data.buffer, input.data.byteOffset, input.data.byteLength))
  return hash.digest()
}

/** The digests of a prompt's media, by the block each item's rows begin in. */
export const mediaDigests = (prompt: PromptInput, blockTokens: number): ReadonlyMap<number, ReadonlyArray<Buffer>> => {
  const media = new Map<number, Array<Buffer>>()
  for (const span of prompt.media) {
    const block = Math.floor(span.start / blockTokens)
    const list = media.get(block) ?? []
    list.push(mediaDigest(span.input))
    media.set(block, list)
  }
  return media
}

/** A block's key for each whole block of `ids`, in order (each chained on the ones before it). */
export const chainKeys = (
  ids: Int32Array,
  media: ReadonlyMap<number, ReadonlyArray<Buffer>>,
  blockTokens: number
): ReadonlyArray<string> => {
  const keys: Array<string> = []
  let previous = ""
  for (let block = 0; block < Math.floor(ids.length / blockTokens); block++) {
    const hash = createHash("sha256")
    hash.update(previous)
    const part = ids.subarray(block * blockTokens, (block + 1) * blockTokens)
    hash.update(new Uint8Array(part.buffer, part.byteOffset, part.byteLength))
    for (const digest of media.get(block) ?? []) hash.update(digest)
    previous = hash.digest("base64")
    keys.push(previous)
  }
  return keys
}

/** A block's key for each whole block of `prompt`, in order (each chained on the ones before it). */
/** Positions per block, unless a runner is given its own. */
export const defaultPrefixBlockTokens = 16

export const blockKeys = (prompt: PromptInput, blockTokens: number): ReadonlyArray<string> =>
  chainKeys(prompt.inputIds, mediaDigests(prompt, blockTokens), blockTokens)

export class PrefixCache {
  /** Blocks by key, least recently used first (a Map keeps insertion order). */
  private readonly blocks = new Map<string, CacheArray>()
  private readonly blockBytes: number
  private counts = { lookups: 0, hits: 0, hitTokens: 0, evictions: 0 }

  constructor(
    readonly blockTokens: number,
    readonly maxBytes: number,
    readonly geometry: PrefixCacheGeometry
  ) {
    if (!Number.isInteger(blockTokens) || blockTokens < 1) throw new Error("a prefix cache block needs a token")
    const { tensors, heads, headDim, half } = geometry
    this.blockBytes = tensors * heads * blockTokens * headDim * (half ? 2 : 4)
  }

  /** The bytes a block holds. */
  get bytesPerBlock(): number {
    return this.blockBytes
  }

  get stats(): PrefixCacheStats {
    return {
      ...this.counts,
      blocks: this.blocks.size,
      bytes: this.blocks.size * this.blockBytes,
      maxBytes: this.maxBytes
    }
  }

  /**
   * How many of `keys`' leading blocks are cached, at most `limit` (a prompt keeps at least one
   * token to run, whose logits give its first token); touches them. Counts a lookup.
   */
  lookup(keys: ReadonlyArray<string>, limit: number): number {
    let found = 0
    while (found < Math.min(keys.length, limit) && this.blocks.has(keys[found]!)) found++
    for (let block = found - 1; block >= 0; block--) {
      const key = keys[block]!
      const data = this.blocks.get(key)!
      this.blocks.delete(key)
      this.blocks.set(key, data)
    }
    this.counts.lookups++
    if (found > 0) {
      this.counts.hits++
      this.counts.hitTokens += found * this.blockTokens
    }
    return found
  }

  /** A past of one row holding the first `count` blocks of `keys` (which `lookup` found). */
  read(keys: ReadonlyArray<string>, count: number): PastData {
    const { tensors: tensorCount, heads, headDim, half } = this.geometry
    const B = this.blockTokens
    const width = count * B
    const size = heads * width * headDim
    const tensors: Array<CacheArray> = Array.from({ length: tensorCount }, () =>
      half ? new Uint16Array(size) : new Float32Array(size)
    )
    const perTensor = heads * B * headDim
    for (let block = 0; block < count; block++) {
      const data = this.blocks.get(keys[block]!)
      if (data === undefined) throw new Error("a prefix cache block was evicted between its lookup and its read")
      for (let t = 0; t < tensorCount; t++) {
        for (let h = 0; h < heads; h++) {
          const from = t * perTensor + h * B * headDim
          tensors[t]!.set(data.subarray(from, from + B * headDim), (h * width + block * B) * headDim)
        }
      }
    }
    return { tensors, width }
  }

  /**
   * Keeps the blocks of `keys` not cached yet, copied from a past whose row `row` holds the
   * prompt's positions (`length` of them, at least `keys.length` blocks' worth) from column
   * `start` (by default right-aligned: its last `length` columns); then evicts down to the bound.
   */
  insert(
    keys: ReadonlyArray<string>,
    source: { readonly past: PastData; readonly row: number; readonly length: number; readonly start?: number }
  ) {
    if (this.blockBytes > this.maxBytes) return
    const { tensors: count, heads, headDim, half } = this.geometry
    const B = this.blockTokens
    const { past, row, length } = source
    const offset = source.start ?? past.width - length
    const perTensor = heads * B * headDim
    keys.forEach((key, block) => {
      if (this.blocks.has(key)) return
      const data = half ? new Uint16Array(count * perTensor) : new Float32Array(count * perTensor)
      for (let t = 0; t < count; t++) {
        const input = past.tensors[t]!
        for (let h = 0; h < heads; h++) {
          const read = ((row * heads + h) * past.width + offset + block * B) * headDim
          data.set(input.subarray(read, read + B * headDim), t * perTensor + h * B * headDim)
        }
      }
      this.blocks.set(key, data)
    })
    while (this.blocks.size * this.blockBytes > this.maxBytes) {
      const oldest = this.blocks.keys().next().value as string
      this.blocks.delete(oldest)
      this.counts.evictions++
    }
  }

  clear(): void {
    this.blocks.clear()
  }
}
