import { Tokenizer } from "@huggingface/tokenizers"
import { describe, expect, it } from "vitest"
import { bytesPerToken, fewestTokens } from "../../../src/executors/llm/PromptBytes.js"
import { type Family, tokenizerFiles } from "./structured/support.js"

/**
 * A prompt's bytes bound its tokens from below, so that a prompt certainly longer than the context
 * is refused untokenized: the bound holds for real tokenizers on texts made to take few tokens
 * (runs of spaces, the longest token over and over, characters a normalizer shrinks), and there is
 * none for tokenizers where a token may stand for any length of text.
 */

const families: ReadonlyArray<Family> = ["qwen3", "llama2"]

const longestTokenText = (tokenizer: Tokenizer): string => {
  let longest = ""
  for (const [piece, id] of tokenizer.get_vocab(false)) {
    const text = tokenizer.decode([id])
    if (text.length > longest.length && !piece.startsWith("<")) longest = text
  }
  return longest
}

const adversarial = (tokenizer: Tokenizer): ReadonlyArray<string> => [
  " ".repeat(20_000),
  "\n".repeat(5000),
  "a".repeat(20_000),
  "1234567890".repeat(1000),
  longestTokenText(tokenizer).repeat(200),
  // Hangul jamo that NFC composes into syllables, three code points of three bytes into one.
  "\u1100\u1161\u11a8".repeat(2000),
  // The Kelvin sign: three bytes that NFC (and lowercasing) make one "K".
  "\u212a".repeat(5000),
  // Mathematical bold capitals: four bytes that NFKC makes one letter.
  "\u{1d400}".repeat(5000),
  "e\u0301".repeat(5000),
  "All work and no play makes Jack a dull boy. ".repeat(500),
  "🦓👩‍👩‍👧‍👦 日本語のテキスト ".repeat(500)
]

describe.each(families)("%s's tokenizer", (family) => {
  it("takes at least a text's bytes over the bound in tokens, for texts made to take few", () => {
    const { json, config } = tokenizerFiles(family)
    const bound = bytesPerToken(json, config)
    expect(bound).toBeDefined()
    const tokenizer = new Tokenizer(json, config)
    for (const text of adversarial(tokenizer)) {
      const tokens = tokenizer.encode(text, { add_special_tokens: false }).ids.length
      expect(tokens, JSON.stringify(text.slice(0, 20))).toBeGreaterThanOrEqual(
        fewestTokens(Buffer.byteLength(text), bound!)
      )
    }
  })
})

describe("the bound", () => {
  it("is the longest token's bytes, times four under a Unicode normalizer that may shrink the text", () => {
    const { json, config } = tokenizerFiles("qwen3")
    // Qwen's longest token is 128 spaces; its normalizer is NFC.
    expect(bytesPerToken(json, config)).toBe(128 * 4)
    expect(bytesPerToken({ ...json, normalizer: null }, config)).toBe(128)
    expect(bytesPerToken({ ...json, normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }] } }, config)).toBe(
      512
    )
  })

  it("is unknown where a token may stand for any length of text", () => {
    const { json, config } = tokenizerFiles("qwen3")
    const added = json.added_tokens as ReadonlyArray<Record<string, unknown>>
    expect(bytesPerToken({ ...json, model: { ...(json.model as object), type: "WordPiece" } }, config)).toBeUndefined()
    expect(bytesPerToken({ ...json, model: { ...(json.model as object), type: "Unigram" } }, config)).toBeUndefined()
    expect(bytesPerToken({ ...json, pre_tokenizer: { type: "Whitespace" } }, config)).toBeUndefined()
    expect(bytesPerToken({ ...json, normalizer: { type: "Strip", left: true, right: true } }, config)).toBeUndefined()
    expect(
      bytesPerToken(
        { ...json, added_tokens: added.map((token, i) => (i === 0 ? { ...token, lstrip: true } : token)) },
        config
      )
    ).toBeUndefined()
    expect(bytesPerToken(json, { ...config, remove_space: true })).toBeUndefined()
    const llama2 = tokenizerFiles("llama2")
    expect(
      bytesPerToken(
        { ...llama2.json, model: { ...(llama2.json.model as object), byte_fallback: false } },
        llama2.config
      )
    ).toBeUndefined()
  })
})
