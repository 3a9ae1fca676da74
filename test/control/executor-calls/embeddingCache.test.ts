import { describe, expect, it } from "vitest"
import {
  cachedEmbedding,
  EmbeddingCache,
  type EmbeddingCacheStats,
  embeddingKey,
  ownedPayload
} from "../../../src/control/executor-calls/EmbeddingCache.js"
import { readDataUrl } from "../../../src/executors/common/media/DataUrl.js"
import { MediaError } from "../../../src/executors/common/media/errors.js"
import { Tensor } from "../../../src/sidecar/Tensor.js"

const entry = (bytes: number) => cachedEmbedding([new Tensor("float32", [bytes / 4], new Float32Array(bytes / 4))])

describe("the cache of encoder outputs", () => {
  it("keys an item by task and everything the encoder reads: modality, media type, processor settings, bytes", () => {
    const image = { modality: "image" }
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 1, 2, 3])
    const base64 = `data:image/png;base64,${png.toString("base64")}`
    // The same bytes under the same media type, however the URL writes them, are one item.
    expect(embeddingKey("enc", image, "data:text/plain,%41%42")).toBe(
      embeddingKey("enc", image, "data:text/plain;base64,QUI=")
    )
    expect(embeddingKey("enc", image, base64)).toBe(
      embeddingKey("enc", image, `data:IMAGE/PNG;base64,${png.toString("base64")}`)
    )
    expect(embeddingKey("enc", image, base64)).not.toBe(embeddingKey("other", image, base64))
    expect(embeddingKey("enc", image, base64)).not.toBe(embeddingKey("enc", { modality: "video" }, base64))
    expect(embeddingKey("enc", image, base64)).not.toBe(
      embeddingKey("enc", image, `data:image/png;base64,${Buffer.from([1]).toString("base64")}`)
    )
    // Another media type may be another reading: audio/pcm16 is raw samples, audio/wav a file.
    const clip = Buffer.from("RIFF\u0000\u0000\u0000\u0000WAVE").toString("base64")
    const audio = { modality: "audio" }
    const readings = ["audio/wav", "audio/pcm16", "audio/l16", ""].map((type) =>
      embeddingKey("enc", audio, `data:${type};base64,${clip}`)
    )
    expect(new Set(readings).size).toBe(4)
    expect(embeddingKey("enc", image, base64)).not.toBe(
      embeddingKey("enc", image, `data:;base64,${png.toString("base64")}`)
    )
    // So are processor settings.
    const resized = embeddingKey("enc", { modality: "image", processor: { max_pixels: 3136 } }, base64)
    expect(resized).not.toBe(embeddingKey("enc", image, base64))
    expect(resized).not.toBe(embeddingKey("enc", { modality: "image", processor: { max_pixels: 6272 } }, base64))
    expect(resized).toBe(embeddingKey("enc", { modality: "image", processor: { max_pixels: 3136 } }, base64))
    // And whose projector embeds it: a shared tower's models answer one image differently.
    expect(embeddingKey("enc", { modality: "image", model: "gemma-3-4b" }, base64)).not.toBe(
      embeddingKey("enc", { modality: "image", model: "gemma-3-12b" }, base64)
    )
    expect(embeddingKey("enc", image, "https://example.com/a.png")).toBeUndefined()
    expect(embeddingKey("enc", image, "file:///tmp/a.png")).toBeUndefined()
    expect(embeddingKey("enc", image, "data:,%E0%A4%A")).toBeUndefined()
  })

  it("keys on exactly the bytes the encoder decodes: a URL the encoder would read otherwise, or refuse, has no key", () => {
    const green = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0, 0xff, 0])
    const blue = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0, 0, 0xff])
    // `;Base64` is base64 to both readers alike.
    const mixedCase = `data:image/png;Base64,${green.toString("base64")}`
    expect(readDataUrl(mixedCase, 1 << 20).bytes).toEqual(green)
    expect(embeddingKey("enc", { modality: "image" }, mixedCase)).toBe(
      embeddingKey("enc", { modality: "image" }, `data:image/png;base64,${green.toString("base64")}`)
    )
    // Data after padding once hashed as one image while another was decoded: now refused by both.
    const smuggled = `data:image/png;base64,${green.toString("base64")}${blue.toString("base64")}`
    expect(green.toString("base64")).toContain("=")
    expect(() => readDataUrl(smuggled, 1 << 20)).toThrow(MediaError)
    expect(embeddingKey("enc", { modality: "image" }, smuggled)).toBeUndefined()
    for (const malformed of ["data:;base64,AAAA AAAA", "data:;base64,A", "data:;base64,AB=C", "data:;base64,AA-_"]) {
      expect(() => readDataUrl(malformed, 1 << 20)).toThrow(MediaError)
      expect(embeddingKey("enc", { modality: "image" }, malformed)).toBeUndefined()
    }
    // Whatever has a key decodes, by the encoder's own reader, to the bytes it was hashed from.
    expect(readDataUrl("data:;base64,AAE", 1 << 20).bytes).toEqual(Buffer.from([0, 1]))
  })

  it("keeps entries up to its bytes, dropping the least recently used first", () => {
    const sizes: Array<EmbeddingCacheStats> = []
    const cache = new EmbeddingCache(1000, (stats) => sizes.push(stats))
    cache.set("a", entry(400))
    cache.set("b", entry(400))
    expect(cache.get("a")).toBeDefined() // a is now the most recently used
    cache.set("c", entry(400)) // over 1000: b goes
    expect(cache.has("b")).toBe(false)
    expect(cache.has("a") && cache.has("c")).toBe(true)
    expect(cache.stats).toEqual({ bytes: 800, entries: 2, maxBytes: 1000 })
    // An entry larger than the whole cache is not kept, and evicts nothing.
    cache.set("huge", entry(2000))
    expect(cache.stats.entries).toBe(2)
    // Setting a key again replaces it.
    cache.set("a", entry(100))
    expect(cache.stats.bytes).toBe(500)
    expect(sizes.at(-1)).toEqual({ bytes: 500, entries: 2, maxBytes: 1000 })
  })

  it("copies what it keeps out of the memory it was received in", () => {
    const arena = new Float32Array([1, 2, 3])
    const owned = ownedPayload(new Tensor("float32", [3], arena)) as Tensor<"float32">
    arena[0] = 9
    expect([...owned.data]).toEqual([1, 2, 3])
    expect(cachedEmbedding([owned, "grid", 7]).bytes).toBe(12 + 4 + 8)
  })
})
