import type { Tokenizer } from "@huggingface/tokenizers"
import * as Schema from "effect/Schema"

/**
 * The transcript of Whisper's generated ids, for one clip or for the overlapping windows a long
 * clip is cut into, as transformers.js 4.3.1's ASR pipeline makes it
 * (`WhisperTokenizer._decode_asr`, after Python transformers' `_decode_asr`):
 *
 * - special tokens are dropped; language tokens only mark where the language changes;
 * - timestamp tokens (`<|0.00|>` … `<|30.00|>`) come in pairs around a segment of text; each
 *   window's times are shifted by where the window starts in the clip;
 * - windows overlap by their strides, so the text of one segment may come from several windows:
 *   their token runs are stitched where they agree best (`findLongestCommonSequence`), and a
 *   timestamp that falls in a stride is skipped, as the neighbouring window sees it better;
 * - each segment's ids are decoded by the tokenizer as they are, without trimming, and the
 *   transcript's text is the segments' texts joined.
 *
 * Left out: word-level timestamps (`return_timestamps: "word"`, which needs the cross-attention
 * alignment of every token) and the language of each chunk (`return_language`). Where the language
 * changes without timestamps the text is still split there, as in the reference, since it changes
 * how the windows are stitched.
 *
 * One deliberate difference: a segment with no text (two timestamps in a row) reads as "", as in
 * Python transformers, where transformers.js fails on decoding no ids.
 */

/** What the merge needs to know of a Whisper tokenizer. */
export interface WhisperVocabulary {
  /** The id of `<|notimestamps|>` + 1: the first timestamp token, `<|0.00|>`. */
  readonly timestampBegin: number
  /** The ids of every special token (added tokens marked special); they never reach the text. */
  readonly specialIds: ReadonlySet<number>
  /** The language tokens among the special ones, with their codes (`<|en|>` → "en"). */
  readonly languageTokens: ReadonlyMap<number, string>
  /** The tokenizer's decoding of a non-empty run of ordinary ids, clean-up as the tokenizer is configured. */
  decode(ids: ReadonlyArray<number>): string
}

/** The ids Whisper generated for one window of the clip. */
export interface WhisperChunkTokens {
  /** The generated ids, as numbers or as the bigints of an int64 tensor. */
  readonly tokens: ReadonlyArray<number | bigint>
  /**
   * Seconds: [window length, left stride, right stride], the strides being the parts shared with
   * the previous and next windows. Absent for a clip read in one piece.
   */
  readonly stride?: readonly [number, number, number]
}

/** A segment of the transcript between two timestamps, in seconds from the start of the clip. */
export interface TranscriptChunk {
  /** The end is null where Whisper did not close the segment (the audio ends mid-sentence); the start, where it never gave one. */
  readonly timestamp: readonly [number | null, number | null]
  readonly text: string
}

export interface Transcript {
  readonly text: string
  /** Present when timestamps were asked for. */
  readonly chunks?: ReadonlyArray<TranscriptChunk>
}

export interface WhisperMergeOptions {
  /** Seconds per timestamp step: the feature extractor's chunk_length / the encoder's max_source_positions (0.02). */
  readonly timePrecision: number
  readonly returnTimestamps: boolean
  /** Refuse a transcript whose last segment has no closing timestamp (when returning timestamps). */
  readonly forceFullSequences?: boolean
}

/** The tokenizer has no `<|notimestamps|>`, so it cannot tell timestamps from text. */
export class NotAWhisperTokenizer extends Schema.TaggedError<NotAWhisperTokenizer>()("NotAWhisperTokenizer", {}) {
  override get message() {
    return "the tokenizer has no <|notimestamps|> token, so it is not a Whisper tokenizer"
  }
}

/** Timestamps were asked for with full sequences, and Whisper's last segment has no closing timestamp. */
export class MissingEndTimestamp extends Schema.TaggedError<MissingEndTimestamp>()("MissingEndTimestamp", {}) {
  override get message() {
    return (
      "Whisper did not predict an ending timestamp, which can happen if audio is cut off in the middle of a word; " +
      "timestamps need generation with Whisper's timestamp rules"
    )
  }
}

/** The language codes Whisper's language tokens carry, as transformers.js knows them. */
const whisperLanguageCodes: ReadonlySet<string> = new Set(
  (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg " +
    "lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so " +
    "af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su"
  ).split(" ")
)

/**
 * The vocabulary of a Whisper tokenizer, read as transformers.js's WhisperTokenizer reads it; the
 * tokenizer is made from tokenizer.json and tokenizer_config.json together, as the latter says
 * whether decoding cleans up spaces before punctuation.
 */
export const whisperVocabulary = (tokenizer: Tokenizer): WhisperVocabulary => {
  const noTimestamps = tokenizer.token_to_id("<|notimestamps|>")
  if (noTimestamps === undefined) throw new NotAWhisperTokenizer()
  const specialIds = new Set<number>()
  const languageTokens = new Map<number, string>()
  for (const token of tokenizer.get_added_tokens_decoder().values()) {
    if (!token.special) continue
    specialIds.add(token.id)
    const code = tokenizer.decode([token.id]).slice(2, -2)
    if (whisperLanguageCodes.has(code)) languageTokens.set(token.id, code)
  }
  return {
    timestampBegin: noTimestamps + 1,
    specialIds,
    languageTokens,
    decode: (ids) => tokenizer.decode([...ids])
  }
}

/** The transcript of one clip from the ids Whisper generated for each of its windows, in order. */
export const mergeWhisperChunks = (
  chunks: ReadonlyArray<WhisperChunkTokens>,
  vocabulary: WhisperVocabulary,
  options: WhisperMergeOptions
): Transcript => {
  const merger = new SegmentMerger(vocabulary, options)
  for (const chunk of chunks) merger.read(chunk)
  const segments = merger.finish()
  const text = segments.map((segment) => segment.text).join("")
  if (!options.returnTimestamps) return { text }
  return { text, chunks: segments.map((segment) => ({ timestamp: [segment.start, segment.end], text: segment.text })) }
}

/** Whisper has 1501 timestamp tokens, 0.00 to 30.00 s. */
const timestampSteps = 1500

interface Segment {
  readonly start: number | null
  readonly end: number | null
  readonly text: string
}

/** How one window's timestamps are read, from its strides. */
interface WindowTimestamps {
  /**
   * The timestamp tokens before this one lie in the left stride: they are not a segment's start or
   * end when the segment began in an earlier window.
   */
  readonly firstTimestamp: number
  /** Timestamp tokens from this one on lie at the window's end, in the right stride: skipped. */
  readonly rightStrideFrom: number | undefined
}

/**
 * The state machine of `_decode_asr`: it reads the windows' ids one by one, gathers the ordinary
 * ids of the open segment (one run per window it spans) and closes the segment at its end
 * timestamp.
 */
class SegmentMerger {
  private readonly segments: Array<Segment> = []
  private start: number | null = null
  /** The open segment's runs of ordinary ids, one per window, to be stitched. */
  private runs: Array<Array<number>> = []
  /** The run of the window being read. */
  private run: Array<number> = []
  /** Set by a timestamp in the right stride: the one after it (its pair) is skipped as well. */
  private skipNextTimestamp = false
  /** Seconds from the clip's start to the start of the window being read. */
  private timeOffset = 0
  private language: string | undefined
  private readonly timestampEnd: number

  constructor(
    private readonly vocabulary: WhisperVocabulary,
    private readonly options: WhisperMergeOptions
  ) {
    this.timestampEnd = vocabulary.timestampBegin + timestampSteps
  }

  read(chunk: WhisperChunkTokens): void {
    const tokens = Array.from(chunk.tokens, Number)
    const window = this.enterWindow(tokens, chunk.stride)
    this.run = []
    for (const token of tokens) this.readToken(token, window)
    if (chunk.stride !== undefined) {
      const [length, , rightStride] = chunk.stride
      this.timeOffset += length - rightStride
    }
    this.leaveWindow()
  }

  finish(): ReadonlyArray<Segment> {
    if (this.runs.length > 0) {
      if (this.options.forceFullSequences === true && this.options.returnTimestamps) throw new MissingEndTimestamp()
      this.closeSegment(null)
    }
    return this.segments
  }

  /** Moves the clock back by the window's left stride, and finds which of its timestamps lie in its strides. */
  private enterWindow(tokens: ReadonlyArray<number>, stride: WhisperChunkTokens["stride"]): WindowTimestamps {
    const { timestampBegin } = this.vocabulary
    if (stride === undefined) return { firstTimestamp: timestampBegin, rightStrideFrom: undefined }
    const [length, leftStride, rightStride] = stride
    this.timeOffset -= leftStride
    return {
      firstTimestamp: leftStride ? leftStride / this.options.timePrecision + timestampBegin : timestampBegin,
      rightStrideFrom: rightStride ? this.rightStrideTimestamp(tokens, length - rightStride) : undefined
    }
  }

  /**
   * The first of the window's trailing timestamp tokens at or after `rightStrideStart` seconds;
   * the window's last timestamp token is always among them, wherever it lies.
   */
  private rightStrideTimestamp(tokens: ReadonlyArray<number>, rightStrideStart: number): number | undefined {
    const { timestampBegin } = this.vocabulary
    let from: number | undefined
    for (let i = tokens.length - 1; i >= 0; i--) {
      const token = tokens[i]!
      if (token < timestampBegin) continue
      if (from !== undefined && (token - timestampBegin) * this.options.timePrecision < rightStrideStart) break
      from = token
    }
    return from
  }

  private readToken(token: number, window: WindowTimestamps): void {
    if (this.vocabulary.specialIds.has(token)) {
      const language = this.vocabulary.languageTokens.get(token)
      if (language !== undefined) this.readLanguage(language)
    } else if (token >= this.vocabulary.timestampBegin && token <= this.timestampEnd) {
      this.readTimestamp(token, window)
    } else {
      this.run.push(token)
    }
  }

  /** Without timestamps, a change of language is the only place the text can be split. */
  private readLanguage(language: string): void {
    if (this.language !== undefined && language !== this.language && !this.options.returnTimestamps) {
      this.runs.push(this.run)
      this.closeSegment(null)
    }
    this.language = language
  }

  private readTimestamp(token: number, window: WindowTimestamps): void {
    if (window.rightStrideFrom !== undefined && token >= window.rightStrideFrom) {
      this.skipNextTimestamp = true
    } else if (this.skipNextTimestamp || (this.runs.length > 0 && token < window.firstTimestamp)) {
      this.skipNextTimestamp = false
    } else {
      const time = this.secondsOf(token)
      if (this.start === null) {
        this.start = time
      } else if (time !== this.start) {
        // The same time twice is a start Whisper repeated, not an end: the segment stays open.
        this.runs.push(this.run)
        this.closeSegment(time)
      }
    }
  }

  /** A timestamp token's time in the clip, rounded to the hundredth of a second. */
  private secondsOf(token: number): number {
    const time = (token - this.vocabulary.timestampBegin) * this.options.timePrecision + this.timeOffset
    return Math.round(time * 100) / 100
  }

  /** Keeps the window's run for the open segment; a window that adds nothing to it drops a segment that has no text. */
  private leaveWindow(): void {
    if (this.run.length > 0) {
      this.runs.push(this.run)
    } else if (this.runs.every((run) => run.length === 0)) {
      this.start = null
      this.runs = []
    }
  }

  private closeSegment(end: number | null): void {
    const ids = longestCommonSequence(this.runs)
    this.segments.push({ start: this.start, end, text: ids.length === 0 ? "" : this.vocabulary.decode(ids) })
    this.start = null
    this.runs = []
    this.run = []
  }
}

/**
 * The runs of consecutive windows stitched into one: each next run is slid along the end of what
 * came before, and the alignment where most ids agree (at least two; longer overlaps win ties) is
 * cut in the middle of the overlap, the left part from the earlier run, the rest from the later.
 * Runs that agree nowhere are simply joined.
 */
const longestCommonSequence = (runs: ReadonlyArray<ReadonlyArray<number>>): Array<number> => {
  const stitched: Array<number> = []
  let left = runs[0] ?? []
  for (const right of runs.slice(1)) {
    const [leftStart, leftStop, rightStart, rightStop] = bestOverlap(left, right)
    stitched.push(...left.slice(0, Math.floor((leftStart + leftStop) / 2)))
    left = right.slice(Math.floor((rightStart + rightStop) / 2))
  }
  stitched.push(...left)
  return stitched
}

/** [leftStart, leftStop, rightStart, rightStop] of the best alignment of `right` after `left`. */
const bestOverlap = (
  left: ReadonlyArray<number>,
  right: ReadonlyArray<number>
): readonly [number, number, number, number] => {
  let best = 0
  let bounds: readonly [number, number, number, number] = [left.length, left.length, 0, 0]
  for (let shift = 1; shift < left.length + right.length; shift++) {
    const leftStart = Math.max(0, left.length - shift)
    const leftStop = Math.min(left.length, left.length + right.length - shift)
    const rightStart = Math.max(0, shift - left.length)
    let matches = 0
    for (let i = 0; i < leftStop - leftStart; i++) {
      if (left[leftStart + i] === right[rightStart + i]) matches++
    }
    const score = matches / shift + shift / 10000
    if (matches > 1 && score > best) {
      best = score
      bounds = [leftStart, leftStop, rightStart, Math.min(right.length, shift)]
    }
  }
  return bounds
}
