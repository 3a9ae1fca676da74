import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ChatMessage } from "../../../src/executors/llm/api.js"
import { expandPlaceholders, mediaParts, PromptError, templateMessages } from "../../../src/executors/llm/Prompt.js"
import { argmax, Sampler } from "../../../src/executors/llm/Sampler.js"
import { TextStream } from "../../../src/executors/llm/TextStream.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import { ChatTokenizer } from "../../../src/models/Tokenizer.js"

let root: string
let tokenizer: ChatTokenizer

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-llm-text-"))
  tokenizer = new ChatTokenizer(await loadModelDirectory(await buildModel("cornserve/tiny-color-vlm", root)))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/** Pushes every token of `text` (and `extra` ids after them); answers what a client saw, delta by delta. */
const stream = (text: string, stops: ReadonlyArray<string> = [], extra: ReadonlyArray<number> = []) => {
  const textStream = new TextStream(tokenizer, stops)
  const deltas: Array<string> = []
  let stopped = false
  for (const id of [...tokenizer.encode(text), ...extra]) {
    const delta = textStream.push(id)
    deltas.push(delta.text)
    stopped = delta.stopped
    if (stopped) break
  }
  if (!stopped) {
    const rest = textStream.end()
    deltas.push(rest.text)
    stopped = rest.stopped
  }
  return { text: deltas.join(""), deltas, stopped, tokens: textStream.tokens }
}

describe("TextStream", () => {
  it("gives the same text token by token as decoding all at once, never half a character", () => {
    const text = "Paint Zürich 🦓 in 中文, then stop."
    const result = stream(text)
    expect(result.text).toBe(text)
    expect(result.stopped).toBe(false)
    // The emoji and the CJK characters take several byte-level tokens; no delta shows a broken one.
    expect(tokenizer.encode("🦓").length).toBeGreaterThan(1)
    for (const delta of result.deltas) expect(delta).not.toContain("\uFFFD")
  })

  it("leaves out special tokens", () => {
    expect(stream("red", [], [tokenizer.tokenId("<|im_end|>")!]).text).toBe("red")
  })

  it("cuts the text before the first stop string and says it stopped", () => {
    const result = stream("The sky is blue and the sea is green.", ["sea", "blue and"])
    expect(result).toMatchObject({ text: "The sky is ", stopped: true })
  })

  it("holds back text that may begin a stop string, and releases it at the end", () => {
    const result = stream("zebra zeb", ["zebu"])
    expect(result.text).toBe("zebra zeb")
    expect(result.stopped).toBe(false)
    // "zeb" could begin "zebu": it only shows at the end.
    expect(result.deltas.at(-1)!.endsWith("zeb")).toBe(true)
  })

  it("finds a stop string that spans tokens", () => {
    const result = stream("flibbertigibbet quux", ["tigib"])
    expect(result).toMatchObject({ text: "flibber", stopped: true })
    expect(result.tokens).toBeLessThan(tokenizer.encode("flibbertigibbet quux").length)
  })
})

describe("Sampler", () => {
  const logits = Float32Array.from([0.5, 2, -1, 1.9, 0, 3, 2.9])

  it("is greedy at temperature 0", () => {
    expect(new Sampler({ temperature: 0, topP: 1, seed: 1 }).next(logits, 2, 5)).toBe(3)
    expect(argmax(logits, 0, 7)).toBe(5)
  })

  it("draws by softmax(logits / temperature), the same draws for the same seed", () => {
    const sampler = new Sampler({ temperature: 1, topP: 1, seed: 7 })
    const counts = [0, 0]
    const pair = Float32Array.from([0, Math.log(3)])
    for (let i = 0; i < 4000; i++) counts[sampler.next(pair, 0, 2)]!++
    expect(counts[1]! / 4000).toBeGreaterThan(0.72)
    expect(counts[1]! / 4000).toBeLessThan(0.78)
    const sequence = (seed: number) => {
      const s = new Sampler({ temperature: 0.8, topP: 0.9, seed })
      return Array.from({ length: 50 }, () => s.next(logits, 0, 7))
    }
    expect(sequence(42)).toEqual(sequence(42))
    expect(sequence(42)).not.toEqual(sequence(43))
  })

  it("keeps to the nucleus: the fewest most likely tokens that reach top_p", () => {
    const sampler = new Sampler({ temperature: 1, topP: 0.5, seed: 3 })
    // Tokens 5 (e^3) and 6 (e^2.9) hold ~70% together; 5 alone ~37%, so the nucleus is {5, 6}.
    const seen = new Set(Array.from({ length: 500 }, () => sampler.next(logits, 0, 7)))
    expect([...seen].sort()).toEqual([5, 6])
  })
})

describe("prompts", () => {
  const messages: ReadonlyArray<ChatMessage> = [
    { role: "system", content: "Be brief." },
    {
      role: "user",
      content: [
        { type: "image_url", image_url: { url: "data:image/png;base64,AA" } },
        { type: "text", text: "and" },
        { type: "input_audio", input_audio: { data: "UklGRg==", format: "wav" } }
      ]
    },
    { role: "assistant", content: "Yes." }
  ]

  it("lists media parts in order and renders them as the chat template's placeholders", () => {
    expect(mediaParts(messages)).toEqual([
      { modality: "image", url: "data:image/png;base64,AA" },
      { modality: "audio", url: "data:audio/wav;base64,UklGRg==" }
    ])
    expect(tokenizer.applyChatTemplate(templateMessages(messages))).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<image>and<audio><|im_end|>\n<|im_start|>assistant\nYes.<|im_end|>\n<|im_start|>assistant\n"
    )
  })

  it("expands each placeholder to its media item's rows", () => {
    const placeholders = new Map([
      [100, "image" as const],
      [200, "audio" as const]
    ])
    const expanded = expandPlaceholders([1, 100, 2, 200, 3], placeholders, [
      { modality: "image", rows: 3 },
      { modality: "audio", rows: 2 }
    ])
    expect([...expanded.inputIds]).toEqual([1, 100, 100, 100, 2, 200, 200, 3])
    expect(expanded.starts).toEqual([1, 5])
    expect(() => expandPlaceholders([100, 100], placeholders, [{ modality: "image", rows: 1 }])).toThrow(PromptError)
    expect(() => expandPlaceholders([1], placeholders, [{ modality: "image", rows: 1 }])).toThrow(
      /placed 0 media placeholders for 1/
    )
    expect(() => expandPlaceholders([200], placeholders, [{ modality: "image", rows: 1 }])).toThrow(/audio placeholder/)
  })
})
