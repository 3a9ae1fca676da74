import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoTokenizer, WhisperTokenizer } from "@huggingface/transformers"
import { Tokenizer } from "@huggingface/tokenizers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { byteLevelBpe } from "../../src/models/ByteLevelBpe.js"
import { Random } from "../../src/models/Random.js"
import {
  MissingEndTimestamp,
  mergeWhisperChunks,
  NotAWhisperTokenizer,
  type Transcript,
  type WhisperVocabulary,
  whisperVocabulary
} from "../../src/models/WhisperTranscript.js"
import { offline } from "./support/TransformersJs.js"

/**
 * Whisper's generated ids merged into a transcript, against transformers.js's
 * WhisperTokenizer._decode_asr as its ASR pipeline calls it (time precision 0.02, windows of 30 s
 * with 5 s strides): the text and the timestamped chunks, for one window and for overlapping ones,
 * and for some hundreds of random generations.
 */

const words = [
  "hello",
  " hello",
  " world",
  " the",
  " quick",
  " brown",
  " fox",
  " jumps",
  " over",
  " lazy",
  " dog",
  ".",
  " .",
  ",",
  " ,",
  "?",
  " 's",
  " n't",
  " I",
  " am",
  " you",
  " are",
  " it",
  " was",
  " a",
  " good",
  " day",
  " and",
  " then",
  " we",
  " went",
  " home",
  " Hallo",
  " Welt",
  " bonjour",
  " le",
  " monde",
  " café",
  " über",
  " straße",
  " 日本"
]
const languages = ["<|en|>", "<|de|>", "<|fr|>", "<|es|>"]
const specials = [
  "<|endoftext|>",
  "<|startoftranscript|>",
  ...languages,
  "<|translate|>",
  "<|transcribe|>",
  "<|startoflm|>",
  "<|startofprev|>",
  "<|nocaptions|>",
  "<|notimestamps|>"
]
const timestampTokens = Array.from({ length: 1501 }, (_, step) => `<|${(step * 0.02).toFixed(2)}|>`)

const bpe = byteLevelBpe({ words, specialTokens: [...specials, ...timestampTokens] })
/** Whisper's timestamp tokens are added tokens that are not special: they must reach `_decode_asr`. */
const tokenizerJson = {
  ...bpe.tokenizerJson,
  added_tokens: (bpe.tokenizerJson.added_tokens as Array<{ content: string }>).map((token) => ({
    ...token,
    special: specials.includes(token.content)
  }))
}
const tokenizerConfig = {
  tokenizer_class: "WhisperTokenizer",
  bos_token: "<|endoftext|>",
  eos_token: "<|endoftext|>",
  unk_token: "<|endoftext|>",
  pad_token: "<|endoftext|>",
  additional_special_tokens: specials.slice(1),
  clean_up_tokenization_spaces: true,
  model_max_length: 448
}

const id = bpe.tokenId
const wordIds = words.map(id)
const specialIds = specials.map(id)
const timestampBegin = id("<|0.00|>")
/** The timestamp token nearest `seconds` into a window. */
const at = (seconds: number) => timestampBegin + Math.min(1500, Math.max(0, Math.round(seconds / 0.02)))

interface Window {
  readonly tokens: ReadonlyArray<number>
  readonly stride: readonly [number, number, number]
}

/** The strides the pipeline gives the windows of a clip of `seconds`, for chunk_length_s 30 (5 s strides). */
const pipelineStrides = (seconds: number): Array<readonly [number, number, number]> => {
  const strides: Array<readonly [number, number, number]> = []
  for (let offset = 0; ; offset += 20) {
    const last = offset + 30 >= seconds
    strides.push([Math.min(30, seconds - offset), offset === 0 ? 0 : 5, last ? 0 : 5])
    if (last) return strides
  }
}

let root: string
let reference: WhisperTokenizer
let ours: WhisperVocabulary

const loadReference = async (): Promise<WhisperTokenizer> => {
  const tokenizer = await AutoTokenizer.from_pretrained(offline(join(root, "whisper-tokenizer")))
  expect(tokenizer).toBeInstanceOf(WhisperTokenizer)
  return tokenizer as WhisperTokenizer
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "whisper-transcript-"))
  const dir = join(root, "whisper-tokenizer")
  await mkdir(dir)
  await writeFile(join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson))
  await writeFile(join(dir, "tokenizer_config.json"), JSON.stringify(tokenizerConfig))
  reference = await loadReference()
  // transformers.js fails on decoding no ids (a segment with no text); Python transformers, and the
  // platform, read it as "".
  const decode = reference.decode.bind(reference)
  reference.decode = ((ids: Array<number>, args?: object) => (ids.length === 0 ? "" : decode(ids, args))) as never
  ours = whisperVocabulary(new Tokenizer(tokenizerJson, tokenizerConfig))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

interface Options {
  readonly returnTimestamps: boolean
  readonly forceFullSequences: boolean
}

const referenceTranscript = (
  tokenizer: WhisperTokenizer,
  windows: ReadonlyArray<Window>,
  { returnTimestamps, forceFullSequences }: Options
): Transcript => {
  const [text, optional] = tokenizer._decode_asr(
    windows.map(({ tokens, stride }) => ({ tokens: tokens.map(BigInt), stride: [...stride] })),
    { time_precision: 0.02, return_timestamps: returnTimestamps, force_full_sequences: forceFullSequences }
  ) as [string, object]
  return { text, ...optional }
}

const ourTranscript = (windows: ReadonlyArray<Window>, { returnTimestamps, forceFullSequences }: Options) =>
  mergeWhisperChunks(windows, ours, { timePrecision: 0.02, returnTimestamps, forceFullSequences })

/** Both transcripts, or both failures (the reference's message, and ours as a MissingEndTimestamp). */
const expectSameAsReference = (windows: ReadonlyArray<Window>, options: Options): Transcript | "refused" => {
  let expected: Transcript
  try {
    expected = referenceTranscript(reference, windows, options)
  } catch (error) {
    expect((error as Error).message).toMatch(/did not predict an ending timestamp/)
    expect(() => ourTranscript(windows, options)).toThrow(MissingEndTimestamp)
    return "refused"
  }
  const actual = ourTranscript(windows, options)
  expect(actual).toStrictEqual(expected)
  return actual
}

const plain = { returnTimestamps: false, forceFullSequences: false }
const timestamped = { returnTimestamps: true, forceFullSequences: false }

const text = (...pieces: ReadonlyArray<string>) => pieces.map(id)
const prompt = (language = "<|en|>") => text("<|startoftranscript|>", language, "<|transcribe|>")
const eot = id("<|endoftext|>")

describe("the Whisper vocabulary", () => {
  it("is what transformers.js's WhisperTokenizer reads", () => {
    expect(ours.timestampBegin).toBe(reference.timestamp_begin)
    expect(ours.timestampBegin).toBe(id("<|notimestamps|>") + 1)
    expect(ours.specialIds).toEqual(new Set(reference.all_special_ids))
    expect([...ours.languageTokens]).toEqual(languages.map((language) => [id(language), language.slice(2, -2)]))
  })

  it("is refused for a tokenizer without <|notimestamps|>", () => {
    const other = byteLevelBpe({ words, specialTokens: ["<|endoftext|>"] })
    expect(() => whisperVocabulary(new Tokenizer(other.tokenizerJson, {}))).toThrow(NotAWhisperTokenizer)
  })
})

describe("one window", () => {
  const clip = (tokens: ReadonlyArray<number>): Array<Window> => [{ tokens, stride: [12.48, 0, 0] }]

  it("without timestamps: the text, as the tokenizer decodes it (leading space, clean-up)", () => {
    const windows = clip([...prompt(), id("<|notimestamps|>"), ...text(" hello", " world", " .", " I", " am"), eot])
    expect(expectSameAsReference(windows, plain)).toEqual({ text: " hello world. I am" })
    expect(expectSameAsReference(windows, timestamped)).toEqual({
      text: " hello world. I am",
      chunks: [{ timestamp: [null, null], text: " hello world. I am" }]
    })
  })

  it("with timestamp pairs: one chunk per pair, a repeated start ignored", () => {
    const windows = clip([
      ...prompt(),
      at(0),
      ...text(" the", " quick", " brown", " fox"),
      at(2.4),
      at(2.4),
      ...text(" jumps", " over"),
      at(4),
      at(4.5),
      at(4.5),
      ...text(" the", " lazy", " dog", "."),
      at(7.12),
      eot
    ])
    expect(expectSameAsReference(windows, timestamped)).toEqual({
      text: " the quick brown fox jumps over the lazy dog.",
      chunks: [
        { timestamp: [0, 2.4], text: " the quick brown fox" },
        { timestamp: [2.4, 4], text: " jumps over" },
        { timestamp: [4.5, 7.12], text: " the lazy dog." }
      ]
    })
    expectSameAsReference(windows, plain)
  })

  it("ending without a closing timestamp: its end is null, or it is refused with full sequences", () => {
    const windows = clip([
      ...prompt(),
      at(0),
      ...text(" hello", " world"),
      at(1.5),
      at(1.6),
      ...text(" it", " was"),
      eot
    ])
    expect(expectSameAsReference(windows, timestamped)).toEqual({
      text: " hello world it was",
      chunks: [
        { timestamp: [0, 1.5], text: " hello world" },
        { timestamp: [1.6, null], text: " it was" }
      ]
    })
    expect(expectSameAsReference(windows, { returnTimestamps: true, forceFullSequences: true })).toBe("refused")
    expect(expectSameAsReference(windows, { returnTimestamps: false, forceFullSequences: true })).toEqual({
      text: " hello world it was"
    })
  })

  it("a pair with no text between reads as an empty chunk, where transformers.js fails", async () => {
    const windows = clip([...prompt(), at(0), at(1), at(1), ...text(" hello"), at(2), eot])
    expect(expectSameAsReference(windows, timestamped)).toEqual({
      text: " hello",
      chunks: [
        { timestamp: [0, 1], text: "" },
        { timestamp: [1, 2], text: " hello" }
      ]
    })
    const unpatched = await loadReference()
    expect(() => referenceTranscript(unpatched, windows, timestamped)).toThrow(/non-empty array/)
  })

  it("takes the bigints of an int64 tensor", () => {
    const tokens = [...prompt(), at(0.5), ...text(" good", " day"), at(1.5), eot]
    expect(
      mergeWhisperChunks([{ tokens: tokens.map(BigInt) }], ours, { timePrecision: 0.02, returnTimestamps: true })
    ).toStrictEqual(mergeWhisperChunks([{ tokens }], ours, { timePrecision: 0.02, returnTimestamps: true }))
  })
})

describe("overlapping windows (30 s, 5 s strides)", () => {
  const strides = pipelineStrides(62.5)

  it("are the pipeline's windows", () => {
    expect(strides).toEqual([
      [30, 0, 5],
      [30, 5, 5],
      [22.5, 5, 0]
    ])
  })

  it("without timestamps: the overlaps are stitched where the windows agree", () => {
    const windows = [
      [" the", " quick", " brown", " fox", " jumps", " over", " the", " lazy"],
      [" fox", " jumps", " over", " the", " lazy", " dog", ".", " I", " went"],
      [".", " I", " went", " home", " and", " then", " we"]
    ].map((pieces, i) => ({
      tokens: [...prompt(), id("<|notimestamps|>"), ...text(...pieces), eot],
      stride: strides[i]!
    }))
    expect(expectSameAsReference(windows, plain)).toEqual({
      text: " the quick brown fox jumps over the lazy dog. I went home and then we"
    })
    expectSameAsReference(windows, timestamped)
  })

  it("without timestamps: windows that agree nowhere are joined", () => {
    const windows = [
      [" hello", " world"],
      [" bonjour", " le", " monde"],
      [" Hallo", " Welt"]
    ].map((pieces, i) => ({
      tokens: [...prompt(), id("<|notimestamps|>"), ...text(...pieces), eot],
      stride: strides[i]!
    }))
    expect(expectSameAsReference(windows, plain)).toEqual({ text: " hello world bonjour le monde Hallo Welt" })
  })

  it("without timestamps: a change of language splits the text before stitching", () => {
    const windows = [
      { tokens: [...prompt("<|en|>"), id("<|notimestamps|>"), ...text(" hello", " world", " it", " was"), eot] },
      { tokens: [...prompt("<|de|>"), id("<|notimestamps|>"), ...text(" world", " it", " was", " Hallo"), eot] }
    ].map((window, i) => ({ ...window, stride: pipelineStrides(45)[i]! }))
    expect(expectSameAsReference(windows, plain)).toEqual({ text: " hello world it was world it was Hallo" })
    expectSameAsReference(windows, timestamped)
  })

  // The first window's timestamps from 26 s on lie in its right stride and are skipped (with the
  // second window's first, their pair); the second window's 6 s (26 s in the clip) closes the segment
  // its text was stitched into; its 27 s lies in its own right stride, skipped with the third
  // window's 2 s, and the third window's 7 s (47 s) closes the stitched " I went home".
  it("with timestamps: times shift by each window's start, and those in the strides are skipped", () => {
    const windows: Array<Window> = [
      {
        tokens: [
          ...prompt(),
          at(0),
          ...text(" the", " quick", " brown"),
          at(11),
          at(12),
          ...text(" fox", " jumps", " over"),
          at(26),
          at(26.5),
          ...text(" the", " lazy"),
          at(29.5),
          eot
        ],
        stride: strides[0]!
      },
      {
        tokens: [
          ...prompt(),
          at(1),
          ...text(" jumps", " over"),
          at(6),
          at(6.5),
          ...text(" the", " lazy", " dog", "."),
          at(12),
          at(13),
          ...text(" I", " went", " home"),
          at(27),
          eot
        ],
        stride: strides[1]!
      },
      {
        tokens: [
          ...prompt(),
          at(2),
          ...text(" I", " went", " home"),
          at(7),
          at(8),
          ...text(" and", " then"),
          at(20),
          eot
        ],
        stride: strides[2]!
      }
    ]
    const transcript = expectSameAsReference(windows, timestamped)
    expect(transcript).toEqual({
      text: " the quick brown fox jumps over the lazy dog. I went home and then",
      chunks: [
        { timestamp: [0, 11], text: " the quick brown" },
        { timestamp: [12, 26], text: " fox jumps over" },
        { timestamp: [26.5, 32], text: " the lazy dog." },
        { timestamp: [33, 47], text: " I went home" },
        { timestamp: [48, 60], text: " and then" }
      ]
    })
    expectSameAsReference(windows, plain)
  })
})

/** The tokens of random Whisper generations: a script of timed segments, seen through each window, with noise. */
class Generations {
  constructor(private readonly random: Random) {}

  private pick<T>(items: ReadonlyArray<T>): T {
    return items[this.random.below(items.length)]!
  }

  private chance(p: number): boolean {
    return this.random.uniform() < p
  }

  /**
   * Segments of 1–6 words over the clip: [start, end, word ids]. The words come from `vocabulary`:
   * a few of them make repetitive speech, where several overlaps of the windows agree.
   */
  private script(
    seconds: number,
    vocabulary: ReadonlyArray<number>
  ): Array<readonly [number, number, ReadonlyArray<number>]> {
    const segments: Array<readonly [number, number, ReadonlyArray<number>]> = []
    let time = this.random.uniform() * 2
    while (time < seconds) {
      const end = time + 0.5 + this.random.uniform() * 6
      segments.push([time, end, Array.from({ length: 1 + this.random.below(6) }, () => this.pick(vocabulary))])
      time = end + (this.chance(0.3) ? 0 : this.random.uniform() * 1.5)
    }
    return segments
  }

  /** What a window from `offset` s of `length` s would hear of the script. */
  private heard(
    script: ReturnType<Generations["script"]>,
    offset: number,
    length: number,
    timestamps: boolean
  ): Array<number> {
    const tokens: Array<number> = []
    for (const [start, end, segment] of script) {
      if (end <= offset || start >= offset + length) continue
      const spoken = segment.filter((_, i) => start + ((end - start) * (i + 0.5)) / segment.length >= offset)
      if (timestamps) tokens.push(at(start - offset))
      tokens.push(...spoken)
      if (end - offset > length) return tokens
      if (timestamps) tokens.push(at(end - offset))
    }
    return tokens
  }

  /** Random edits: a token dropped, another word, a stray timestamp, special token or byte. */
  private noisy(tokens: ReadonlyArray<number>, rate: number): Array<number> {
    const out: Array<number> = []
    for (const token of tokens) {
      if (!this.chance(rate)) {
        out.push(token)
        continue
      }
      const edit = this.random.below(5)
      if (edit === 1) out.push(this.pick(wordIds))
      if (edit === 2) out.push(token, timestampBegin + this.random.below(1501))
      if (edit === 3) out.push(this.pick(specialIds), token)
      if (edit === 4) out.push(this.random.below(256))
    }
    return out
  }

  private randomToken(): number {
    const kind = this.random.below(10)
    if (kind < 5) return this.pick(wordIds)
    if (kind < 8) return timestampBegin + this.random.below(1501)
    if (kind < 9) return this.pick(specialIds)
    return this.random.below(256)
  }

  /** One clip's windows, 1–4 of them. */
  clip(): Array<Window> {
    const seconds = Math.round((1 + this.random.uniform() * 89) * 100) / 100
    const strides = pipelineStrides(seconds)
    if (this.chance(0.15)) {
      return strides.map((stride) => ({
        tokens: Array.from({ length: this.random.below(40) }, () => this.randomToken()),
        stride
      }))
    }
    const script = this.script(seconds, this.chance(0.3) ? wordIds.slice(0, 1 + this.random.below(3)) : wordIds)
    const timestamps = this.chance(0.7)
    const rate = this.pick([0, 0, 0.03, 0.1])
    let language = this.pick(languages)
    return strides.map((stride, i) => {
      if (this.chance(0.15)) language = this.pick(languages)
      const head = [...prompt(language), ...(timestamps ? [] : [id("<|notimestamps|>")])]
      const body = this.chance(0.1)
        ? Array.from({ length: this.random.below(4) }, () => at(this.random.uniform() * stride[0]))
        : this.noisy(this.heard(script, i * 20, stride[0], timestamps), rate)
      return { tokens: [...head, ...body, ...(this.chance(0.9) ? [eot] : [])], stride }
    })
  }
}

describe("random generations", () => {
  it("merge as transformers.js merges them", () => {
    const generations = new Generations(new Random(20250617))
    const seen = { clips: 0, severalWindows: 0, openEnds: 0, refused: 0, chunks: 0 }
    for (let i = 0; i < 400; i++) {
      const windows = generations.clip()
      seen.clips++
      if (windows.length > 1) seen.severalWindows++
      expectSameAsReference(windows, plain)
      const transcript = expectSameAsReference(windows, timestamped)
      if (transcript !== "refused") {
        seen.chunks += transcript.chunks?.length ?? 0
        if (transcript.chunks?.some((chunk) => chunk.timestamp[1] === null)) seen.openEnds++
      }
      if (expectSameAsReference(windows, { returnTimestamps: true, forceFullSequences: true }) === "refused") {
        seen.refused++
      }
    }
    expect(seen.severalWindows).toBeGreaterThan(200)
    expect(seen.openEnds).toBeGreaterThan(20)
    expect(seen.refused).toBeGreaterThan(20)
    expect(seen.chunks).toBeGreaterThan(1000)
  })
})
