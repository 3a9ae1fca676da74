/**
 * Writes byte-level BPE tokenizers in the Hugging Face tokenizer.json format (the GPT-2 / Qwen
 * scheme): text is split by the GPT-2 pattern, each piece becomes bytes written as printable
 * characters, and merges join them. Every byte is in the vocabulary, so any text encodes (unknown
 * words fall apart into smaller pieces) and decodes back to itself.
 */

/** GPT-2's reversible map from byte values to printable characters. */
export const byteCharacters: ReadonlyArray<string> = (() => {
  const printable: Array<number> = []
  const addRange = (from: string, to: string) => {
    for (let c = from.charCodeAt(0); c <= to.charCodeAt(0); c++) printable.push(c)
  }
  addRange("!", "~")
  addRange("¡", "¬")
  addRange("®", "ÿ")
  const characters = new Array<string>(256)
  let shifted = 0
  for (let byte = 0; byte < 256; byte++) {
    characters[byte] = printable.includes(byte) ? String.fromCharCode(byte) : String.fromCharCode(256 + shifted++)
  }
  return characters
})()

/** How a piece of text is spelled in a byte-level vocabulary (" red" → "Ġred"). */
const byteLevel = (text: string): string =>
  Array.from(new TextEncoder().encode(text), (byte) => byteCharacters[byte]!).join("")

/**
 * Learns merges from `words` (byte-level spellings) until each word is a single token. The most
 * frequent pair goes first, ties broken by the pair's spelling, so the result is deterministic;
 * encoding a word replays the same merges, so each word encodes to its one token.
 */
const learnMerges = (words: ReadonlyArray<string>): Array<readonly [string, string]> => {
  const spelled = words.map((word) => Array.from(word))
  const merges: Array<readonly [string, string]> = []
  for (;;) {
    const counts = new Map<string, number>()
    for (const symbols of spelled) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        const pair = `${symbols[i]} ${symbols[i + 1]}`
        counts.set(pair, (counts.get(pair) ?? 0) + 1)
      }
    }
    if (counts.size === 0) return merges
    const [best] = [...counts.entries()].reduce((a, b) => (b[1] > a[1] || (b[1] === a[1] && b[0] < a[0]) ? b : a))
    const [left, right] = best.split(" ") as [string, string]
    merges.push([left, right])
    for (const symbols of spelled) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        if (symbols[i] === left && symbols[i + 1] === right) symbols.splice(i, 2, left + right)
      }
    }
  }
}

export interface ByteLevelBpeSpec {
  /** Text pieces that become single tokens, e.g. "red" and " red" (the GPT-2 split keeps a leading space). */
  readonly words: ReadonlyArray<string>
  /** Tokens matched before splitting, e.g. "<|im_end|>"; they take the last ids. */
  readonly specialTokens: ReadonlyArray<string>
  /** Pads the vocabulary with never-produced tokens up to this size (a realistic vocabulary for benchmarks). */
  readonly vocabSize?: number
}

export interface ByteLevelBpe {
  /** The content of tokenizer.json. */
  readonly tokenizerJson: Record<string, unknown>
  readonly vocabSize: number
  /** The id of a token given as text ("red", " red", "<|im_end|>"). */
  readonly tokenId: (text: string) => number
}

const fillerTokens = function* (taken: ReadonlySet<string>): Generator<string> {
  const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
  for (let length = 2; ; length++) {
    const digits = new Array<number>(length).fill(0)
    for (;;) {
      const token = digits.map((d) => letters[d]).join("")
      if (!taken.has(token)) yield token
      let i = length - 1
      while (i >= 0 && digits[i] === letters.length - 1) digits[i--] = 0
      if (i < 0) break
      digits[i]!++
    }
  }
}

export const byteLevelBpe = (spec: ByteLevelBpeSpec): ByteLevelBpe => {
  const merges = learnMerges(spec.words.map(byteLevel))
  const vocab = new Map<string, number>()
  const add = (token: string) => {
    if (!vocab.has(token)) vocab.set(token, vocab.size)
  }
  byteCharacters.forEach(add)
  for (const [left, right] of merges) add(left + right)
  if (spec.vocabSize !== undefined) {
    const fillers = spec.vocabSize - spec.specialTokens.length - vocab.size
    if (fillers < 0) throw new Error(`a vocabulary of ${spec.vocabSize} is too small for ${vocab.size} tokens`)
    const filler = fillerTokens(new Set(vocab.keys()))
    for (let i = 0; i < fillers; i++) add(filler.next().value!)
  }
  const firstSpecial = vocab.size
  spec.specialTokens.forEach(add)

  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: spec.specialTokens.map((content, i) => ({
      id: firstSpecial + i,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true
    })),
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: "",
      end_of_word_suffix: "",
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab: Object.fromEntries(vocab),
      merges: merges.map(([left, right]) => `${left} ${right}`)
    }
  }
  const tokenId = (text: string) => {
    const id = vocab.get(spec.specialTokens.includes(text) ? text : byteLevel(text))
    if (id === undefined) throw new Error(`"${text}" is not a single token of this vocabulary`)
    return id
  }
  return { tokenizerJson, vocabSize: vocab.size, tokenId }
}
