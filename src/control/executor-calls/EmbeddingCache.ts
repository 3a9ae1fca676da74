import { createHash } from "node:crypto"
import type { Payload } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { type DataUrlMedia, readDataUrl } from "../../executors/common/media/DataUrl.js"

/**
 * Encoder outputs by content: the chunks an encoder task sent for one media item, keyed by the
 * task and what the encoder read (the item's bytes, its media type, the call's modality and
 * processor settings), kept up to a bytes limit and dropped least recently used first. Every app and LLM that uses the encoder task shares it: a hit is forwarded through the
 * sidecar as the encoder would have sent it, and the encoder is not called.
 */

/** What the encoder sent for one item: its chunks, in order, in memory of their own. */
export interface CachedEmbedding {
  readonly chunks: ReadonlyArray<Payload>
  readonly bytes: number
}

const payloadBytes = (payload: Payload): number =>
  payload instanceof Tensor
    ? payload.byteLength
    : payload instanceof Uint8Array
      ? payload.byteLength
      : typeof payload === "string"
        ? Buffer.byteLength(payload)
        : 8

/** A payload in memory of its own: what the sidecar hands out are views of its arena. */
export const ownedPayload = (payload: Payload): Payload =>
  payload instanceof Tensor
    ? new Tensor(payload.dtype, payload.shape, payload.data.slice())
    : payload instanceof Uint8Array
      ? payload.slice()
      : payload

export const cachedEmbedding = (chunks: ReadonlyArray<Payload>): CachedEmbedding => ({
  chunks,
  bytes: chunks.reduce<number>((sum, chunk) => sum + payloadBytes(chunk), 0)
})

/** What an encoder call says about how its items are to be read, besides each item's URL. */
export interface ItemReading {
  readonly modality: string
  /** The media processor's settings (mm_processor_kwargs), as the call sends them to the encoder. */
  readonly processor?: unknown
  /** Whose projector embeds it (an encoder with adapters embeds one image for several models). */
  readonly model?: string
}

/**
 * The cache key of an encoder's item: the task, then everything the encoder reads the item from,
 * and nothing else. The encoder gets the item's bytes and media type from the same reader of
 * `data:` URLs (`readDataUrl`), and the call's modality and processor settings; its model and
 * limits are the task's. So the key holds the media type as that reader gives it (audio as
 * `audio/pcm16` is raw samples, as `audio/wav` a file: the same bytes, two clips), the modality
 * and the settings, and the SHA-256 of the bytes. Only `data:` URLs carry their bytes; an item
 * fetched from elsewhere (whose bytes could change under the same URL) has none and is not cached,
 * nor is one the encoder would refuse.
 */
export const embeddingKey = (taskId: string, reading: ItemReading, url: string): string | undefined => {
  let media: DataUrlMedia
  try {
    media = readDataUrl(url, Number.MAX_SAFE_INTEGER)
  } catch {
    return undefined
  }
  const how = JSON.stringify([
    reading.modality,
    media.mimeType ?? null,
    reading.processor ?? null,
    reading.model ?? null
  ])
  const hash = createHash("sha256").update(media.bytes).digest("hex")
  return `${taskId}\u0000${how}\u0000${hash}`
}

export interface EmbeddingCacheStats {
  readonly bytes: number
  readonly entries: number
  readonly maxBytes: number
}

export class EmbeddingCache {
  /** Least recently used first (a Map keeps insertion order; a use moves an entry to the end). */
  private readonly entries = new Map<string, CachedEmbedding>()
  private bytesHeld = 0

  constructor(
    readonly maxBytes: number,
    /** Told of each change of size, for the metrics. */
    private readonly onSize: (stats: EmbeddingCacheStats) => void = () => undefined
  ) {}

  get(key: string): CachedEmbedding | undefined {
    const entry = this.entries.get(key)
    if (entry === undefined) return undefined
    this.entries.delete(key)
    this.entries.set(key, entry)
    return entry
  }

  has(key: string): boolean {
    return this.entries.has(key)
  }

  /** Keeps `entry` (unless it alone is over the limit), dropping the least recently used to make room. */
  set(key: string, entry: CachedEmbedding): void {
    if (entry.bytes > this.maxBytes) return
    const previous = this.entries.get(key)
    if (previous !== undefined) {
      this.entries.delete(key)
      this.bytesHeld -= previous.bytes
    }
    for (const [oldest, old] of this.entries) {
      if (this.bytesHeld + entry.bytes <= this.maxBytes) break
      this.entries.delete(oldest)
      this.bytesHeld -= old.bytes
    }
    this.entries.set(key, entry)
    this.bytesHeld += entry.bytes
    this.onSize(this.stats)
  }

  get stats(): EmbeddingCacheStats {
    return { bytes: this.bytesHeld, entries: this.entries.size, maxBytes: this.maxBytes }
  }
}
