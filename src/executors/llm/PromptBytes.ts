import { tokenBytes } from "./structured/TokenVocabulary.js"

/**
 * What a prompt's length in bytes says of its length in tokens, before it is tokenized: a token
 * stands for at most as many bytes of the text as its longest spelling, so a text of `b` bytes
 * takes at least `b / bytesPerToken` tokens, and a prompt certainly longer than the model's
 * context is refused without tokenizing it.
 *
 * That holds for BPE, where every byte of the normalized text lands in one token, or in one
 * unknown token per character at most: not where unknown characters fuse into one token, nor
 * where the pre-tokenizer drops characters (whitespace splitting) or added tokens strip the
 * whitespace beside them, nor for Unigram or WordPiece
 * (an unknown word of any length is one token). A normalizer may shrink the text: Unicode
 * normalization and lowercasing by at most four bytes to one (𝐀 is A under NFKC, the Kelvin sign
 * k lowercased), prepending and replacing a space with "▁" not at all; any other normalizer
 * leaves the bound unknown. Without a bound (undefined), the prompt is tokenized in a thread.
 */

interface Component {
  readonly type?: string
  readonly normalizers?: ReadonlyArray<Component>
  readonly pretokenizers?: ReadonlyArray<Component>
  readonly pattern?: { readonly String?: string; readonly Regex?: string }
  readonly content?: string
  readonly behavior?: string
}

const utf8 = new TextEncoder()

/** How many times fewer bytes a normalizer may leave of a text; undefined when it may drop any. */
const shrinkage = (normalizer: Component | null | undefined): number | undefined => {
  if (normalizer === null || normalizer === undefined) return 1
  switch (normalizer.type) {
    case "Sequence":
      return (normalizer.normalizers ?? []).reduce<number | undefined>((product, inner) => {
        const factor = shrinkage(inner)
        return product === undefined || factor === undefined ? undefined : product * factor
      }, 1)
    case "NFC":
    case "NFD":
    case "NFKC":
    case "NFKD":
    case "Lowercase":
      return 4
    case "Prepend":
      return 1
    case "Replace": {
      const pattern = normalizer.pattern?.String
      if (pattern === undefined || pattern.length === 0) return undefined
      const replaced = utf8.encode(pattern).length
      const by = utf8.encode(normalizer.content ?? "").length
      return by === 0 ? undefined : Math.max(1, replaced / by)
    }
    default:
      return undefined
  }
}

/** Whether a pre-tokenizer keeps every character of the text in some piece. */
const keepsEverything = (pre: Component | null | undefined): boolean => {
  if (pre === null || pre === undefined) return true
  switch (pre.type) {
    case "Sequence":
      return (pre.pretokenizers ?? []).every(keepsEverything)
    case "ByteLevel":
    case "Metaspace":
    case "Digits":
    case "Punctuation":
      return true
    case "Split":
      return pre.behavior !== "Removed"
    default:
      return false
  }
}

const hasByteLevel = (pre: Component | null | undefined): boolean =>
  pre?.type === "ByteLevel" || (pre?.type === "Sequence" && (pre.pretokenizers ?? []).some(hasByteLevel))

/**
 * The most bytes of a text one token of this tokenizer stands for (tokenizer.json and
 * tokenizer_config.json), or undefined when no such bound holds.
 */
export const bytesPerToken = (
  tokenizerJson: Readonly<Record<string, unknown>>,
  config: Readonly<Record<string, unknown>>
): number | undefined => {
  const model = tokenizerJson.model as
    | { type?: string; unk_token?: string | null; fuse_unk?: boolean; byte_fallback?: boolean; vocab?: unknown }
    | undefined
  const pre = tokenizerJson.pre_tokenizer as Component | null | undefined
  const added = (tokenizerJson.added_tokens ?? []) as ReadonlyArray<{
    readonly content?: string
    readonly lstrip?: boolean
    readonly rstrip?: boolean
  }>
  const strips = added.some((token) => token.lstrip === true || token.rstrip === true)
  const drops = config.remove_space === true || config.do_lowercase_and_remove_accent === true
  if (model?.type !== "BPE" || strips || drops || !keepsEverything(pre)) return undefined
  if (model.unk_token != null && model.fuse_unk === true && model.byte_fallback !== true && !hasByteLevel(pre))
    return undefined
  const shrink = shrinkage(tokenizerJson.normalizer as Component | null | undefined)
  if (shrink === undefined) return undefined
  let longest = 0
  let spellings: ReadonlyArray<Uint8Array | undefined>
  try {
    spellings = tokenBytes(tokenizerJson)
  } catch {
    // A decoder the vocabulary index does not read: a token's own characters are at least its bytes.
    const vocab = model.vocab
    const pieces = Array.isArray(vocab)
      ? vocab.map((entry) => String((entry as ReadonlyArray<unknown>)[0]))
      : Object.keys(vocab ?? {})
    spellings = pieces.map((piece) => utf8.encode(piece))
  }
  for (const bytes of spellings) if (bytes !== undefined && bytes.length > longest) longest = bytes.length
  for (const token of added) longest = Math.max(longest, utf8.encode(token.content ?? "").length)
  return longest === 0 ? undefined : longest * shrink
}

/** The fewest tokens a text of `bytes` bytes takes, where no token stands for more than `perToken`. */
export const fewestTokens = (bytes: number, perToken: number): number => Math.ceil(bytes / perToken)
