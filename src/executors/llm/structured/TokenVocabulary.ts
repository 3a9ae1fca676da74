import * as Schema from "effect/Schema"
import { byteCharacters } from "../../../models/ByteLevelBpe.js"
import { ByteTrie } from "./ByteTrie.js"
import { scanString, stringCompletion, stringSubstates } from "./JsonString.js"

/**
 * A model's tokens as bytes, indexed once per tokenizer for constrained decoding: a byte trie of
 * every token, the tokens that stay inside a JSON string (per string substate, made when first
 * needed) and the masks computed for grammar states, kept in a least-recently-used cache that
 * every request of the model shares.
 *
 * A token without bytes (a special or control token, an added token such as `<think>`, an id
 * past the tokenizer in a padded vocabulary) is never allowed inside JSON; the end-of-sequence
 * ids are allowed exactly when the value is complete.
 */

/** The tokens a grammar state allows, and the most that one of them leaves to write. */
export interface MaskEntry {
  /** 1 where the token is allowed (end of sequence included when the value is complete). */
  readonly mask: Uint8Array
  /** The largest number of bytes an allowed token leaves to write: with more budget than that, the mask holds as is. */
  readonly maxNeed: number
  /** Made when a tight budget first needs them. */
  byNeed: NeedLevels | undefined
}

/** Allowed tokens by the fewest bytes each leaves to write, most first: `needs[i]` for `tokens[ends[i - 1] .. ends[i])`. */
export interface NeedLevels {
  readonly tokens: Int32Array
  readonly needs: ReadonlyArray<number>
  readonly ends: ReadonlyArray<number>
}

/** The tokens of one string substate: those that stay inside the string, and those that close it. */
export interface StringTokens {
  readonly inside: Uint8Array
  /** The inside tokens by the bytes each leaves to finish the string (its character or escape, and the quote). */
  readonly insideLevels: NeedLevels
  /** What follows the closing quote in each closing token (the empty suffix at the root). */
  readonly closing: ByteTrie
}

export interface VocabularyOptions {
  /** The logits row's width, when the model pads its vocabulary past the tokenizer's ids. */
  readonly size?: number
  /** What the mask cache may hold, in bytes (64 MiB unless given). */
  readonly cacheBytes?: number
}

/** Bytes that a shortest completion may need one token each for: printable ASCII and UTF-8 lead/continuation bytes. */
const completionBytes = { from: 0x20, to: 0xf4 } as const

export class TokenVocabulary {
  readonly size: number
  readonly bytes: ReadonlyArray<Uint8Array | undefined>
  readonly endOfSequence: ReadonlyArray<number>
  readonly trie: ByteTrie
  /** Bytes in completionBytes that no single token spells. */
  readonly missingBytes: ReadonlyArray<number>
  private readonly strings: Array<StringTokens | undefined> = new Array(stringSubstates)
  private readonly cache: MaskCache
  private readonly grammarIds = new Map<string, number>()

  constructor(
    tokens: ReadonlyArray<Uint8Array | undefined>,
    endOfSequence: ReadonlyArray<number>,
    options: VocabularyOptions = {}
  ) {
    this.size = Math.max(options.size ?? 0, tokens.length, ...endOfSequence.map((id) => id + 1))
    this.bytes = spelling(tokens, endOfSequence, this.size)
    this.endOfSequence = [...new Set(endOfSequence)]
    const entries: Array<readonly [Uint8Array, number]> = []
    this.bytes.forEach((bytes, id) => {
      if (bytes !== undefined) entries.push([bytes, id])
    })
    this.trie = new ByteTrie(entries)
    this.missingBytes = unspelledBytes(this.bytes)
    this.cache = new MaskCache(options.cacheBytes ?? 64 * 1024 * 1024)
  }

  /** The vocabulary of a Hugging Face tokenizer.json (byte-level BPE, or sentencepiece with byte fallback). */
  static fromTokenizerJson(
    tokenizerJson: Readonly<Record<string, unknown>>,
    endOfSequence: ReadonlyArray<number>,
    options: VocabularyOptions = {}
  ): TokenVocabulary {
    return new TokenVocabulary(tokenBytes(tokenizerJson), endOfSequence, options)
  }

  /** The tokens of a string substate, sorted once. */
  stringTokens(substate: number): StringTokens {
    const known = this.strings[substate]
    if (known !== undefined) return known
    const inside = new Uint8Array(this.size)
    const insideIds: Array<number> = []
    const insideNeeds: Array<number> = []
    const closing: Array<readonly [Uint8Array, number]> = []
    this.bytes.forEach((bytes, id) => {
      if (bytes === undefined) return
      const scan = scanString(substate, bytes)
      if (scan.kind === "inside") {
        inside[id] = 1
        insideIds.push(id)
        insideNeeds.push(stringCompletion[scan.substate]!.length + 1)
      } else if (scan.kind === "closed") {
        closing.push([bytes.subarray(scan.at + 1), id])
      }
    })
    const needs = [...new Set(insideNeeds)].sort((a, b) => b - a)
    const byNeed = needs.map((need) => insideIds.filter((_, i) => insideNeeds[i] === need))
    const ends: Array<number> = []
    byNeed.reduce((at, group) => {
      ends.push(at + group.length)
      return at + group.length
    }, 0)
    const tokens: StringTokens = {
      inside,
      insideLevels: { tokens: Int32Array.from(byNeed.flat()), needs, ends },
      closing: new ByteTrie(closing)
    }
    this.strings[substate] = tokens
    return tokens
  }

  /** The cache's key of a grammar's state. */
  maskKey(grammarKey: string, stateSig: string): string {
    let id = this.grammarIds.get(grammarKey)
    if (id === undefined) {
      // A bound on the schemas remembered: past it, start afresh.
      if (this.grammarIds.size >= 4096) {
        this.grammarIds.clear()
        this.cache.clear()
      }
      id = this.grammarIds.size
      this.grammarIds.set(grammarKey, id)
    }
    return `${id}|${stateSig}`
  }

  /** The cached mask of a state, made by `compute` when it is not cached. */
  masked(key: string, compute: () => MaskEntry): MaskEntry {
    const cached = this.cache.get(key)
    if (cached !== undefined) return cached
    const entry = compute()
    this.cache.set(key, entry)
    return entry
  }

  /** A cached entry's tokens by need, made once. */
  needLevels(key: string, entry: MaskEntry, compute: () => NeedLevels): NeedLevels {
    if (entry.byNeed === undefined) {
      entry.byNeed = compute()
      this.cache.grew(key, entry)
    }
    return entry.byNeed
  }
}

class MaskCache {
  private readonly entries = new Map<string, MaskEntry>()
  private bytes = 0

  constructor(private readonly capacity: number) {}

  get(key: string): MaskEntry | undefined {
    const entry = this.entries.get(key)
    if (entry !== undefined) {
      this.entries.delete(key)
      this.entries.set(key, entry)
    }
    return entry
  }

  set(key: string, entry: MaskEntry): void {
    this.entries.set(key, entry)
    this.bytes += size(entry)
    this.fit()
  }

  /** The entry got its need levels. */
  grew(key: string, entry: MaskEntry): void {
    if (this.entries.get(key) !== entry) return
    this.bytes += entry.byNeed?.tokens.byteLength ?? 0
    this.fit()
  }

  /** The oldest entries go until the cache fits its capacity (the newest always stays). */
  private fit(): void {
    for (const [oldest, old] of this.entries) {
      if (this.bytes <= this.capacity || this.entries.size <= 1) break
      this.entries.delete(oldest)
      this.bytes -= size(old)
    }
  }

  clear(): void {
    this.entries.clear()
    this.bytes = 0
  }
}

const size = (entry: MaskEntry) => entry.mask.byteLength + (entry.byNeed?.tokens.byteLength ?? 0)

/** The bytes each token writes inside JSON: none for an empty one or an end of sequence. */
const spelling = (
  tokens: ReadonlyArray<Uint8Array | undefined>,
  endOfSequence: ReadonlyArray<number>,
  size: number
): Array<Uint8Array | undefined> =>
  Array.from({ length: size }, (_, id) => {
    const bytes = tokens[id]
    return bytes === undefined || bytes.length === 0 || endOfSequence.includes(id) ? undefined : bytes
  })

/** The bytes a shortest completion may need that no single token spells. */
const unspelledBytes = (bytes: ReadonlyArray<Uint8Array | undefined>): Array<number> => {
  const single = new Set<number>()
  for (const token of bytes) if (token?.length === 1) single.add(token[0]!)
  const missing: Array<number> = []
  for (let byte = completionBytes.from; byte <= completionBytes.to; byte++) if (!single.has(byte)) missing.push(byte)
  return missing
}

/** What `new TokenVocabulary(tokens, endOfSequence).missingBytes` is, without indexing the vocabulary. */
export const missingBytes = (
  tokens: ReadonlyArray<Uint8Array | undefined>,
  endOfSequence: ReadonlyArray<number>
): ReadonlyArray<number> => unspelledBytes(spelling(tokens, endOfSequence, tokens.length))

/** A tokenizer that cannot spell every byte in one token: no value can be planned to its end. */
export class UnspelledBytes extends Schema.TaggedError<UnspelledBytes>()("UnspelledBytes", {
  /** The bytes no token spells alone. */
  bytes: Schema.Array(Schema.Number)
}) {
  override get message() {
    return `constrained decoding needs a token for each byte (a byte-level or byte-fallback tokenizer); none spells ${this.bytes.map((b) => `0x${b.toString(16)}`).join(", ")}`
  }
}

/** GPT-2's byte-level alphabet read backwards: character code to byte (-1 for none). */
const byteLevelBytes: Int16Array = (() => {
  const table = new Int16Array(512).fill(-1)
  byteCharacters.forEach((character, byte) => {
    table[character.charCodeAt(0)] = byte
  })
  return table
})()

const utf8 = new TextEncoder()

/**
 * Each token id's bytes, as the tokenizer's decoder writes them: byte-level tokens through GPT-2's
 * alphabet; sentencepiece tokens with "▁" as a space and `<0xNN>` as that byte. Added tokens
 * (special or not) have none. A decoder's Strip step (which drops the first space of a whole
 * text) is left out: JSON never starts with a space.
 */
export const tokenBytes = (tokenizerJson: Readonly<Record<string, unknown>>): Array<Uint8Array | undefined> => {
  const model = tokenizerJson.model as { type?: string; vocab?: unknown; byte_fallback?: boolean } | undefined
  if (model === undefined || typeof model.vocab !== "object" || model.vocab === null) {
    throw new Error("tokenizer.json has no model.vocab")
  }
  const pieces: Array<readonly [string, number]> = Array.isArray(model.vocab)
    ? (model.vocab as ReadonlyArray<readonly [string, number]>).map(([piece], id) => [piece, id] as const)
    : Object.entries(model.vocab as Record<string, number>)
  const decoder = tokenizerJson.decoder as { type?: string; decoders?: ReadonlyArray<unknown> } | null | undefined
  const steps = (
    decoder?.type === "Sequence" ? (decoder.decoders ?? []) : decoder == null ? [] : [decoder]
  ) as ReadonlyArray<{
    type?: string
    pattern?: { String?: string }
    content?: string
  }>
  const unsupported = steps.find(
    (step) => !["ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"].includes(step.type ?? "")
  )
  if (unsupported !== undefined) throw new Error(`tokenizer.json's ${unsupported.type} decoder is not supported`)
  const byteLevel = steps.some((step) => step.type === "ByteLevel")
  const byteFallback = steps.some((step) => step.type === "ByteFallback")
  const metaspace = steps.some(
    (step) =>
      step.type === "Metaspace" || (step.type === "Replace" && step.pattern?.String === "▁" && step.content === " ")
  )
  const bytesOf = (piece: string): Uint8Array | undefined => {
    if (byteLevel) {
      const bytes = new Uint8Array(piece.length)
      for (let i = 0; i < piece.length; i++) {
        const byte = byteLevelBytes[piece.charCodeAt(i)] ?? -1
        if (byte < 0) return undefined
        bytes[i] = byte
      }
      return bytes
    }
    const fallback = byteFallback ? /^<0x([0-9A-Fa-f]{2})>$/.exec(piece) : null
    if (fallback !== null) return Uint8Array.of(Number.parseInt(fallback[1]!, 16))
    return utf8.encode(metaspace ? piece.replaceAll("▁", " ") : piece)
  }
  const tokens: Array<Uint8Array | undefined> = []
  for (const [piece, id] of pieces) tokens[id] = bytesOf(piece)
  const added = (tokenizerJson.added_tokens ?? []) as ReadonlyArray<{ id: number }>
  for (const { id } of added) tokens[id] = undefined
  return Array.from(tokens)
}
