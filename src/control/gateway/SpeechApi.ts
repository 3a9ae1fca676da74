/**
 * OpenAI's `POST /app/:id/v1/audio/speech` reply: a speech app streams PCM16 chunks at its model's
 * rate, and the gateway writes them, as they arrive, in the `response_format` asked for: wav as
 * they are behind a header, pcm as OpenAI's 24 kHz, and mp3, opus (in ogg), aac (ADTS) and flac
 * encoded by an ffmpeg child whose output is the body as it comes. With `stream_format: "sse"` the
 * same bytes go out base64 in `speech.audio.delta` events.
 *
 * The headers wait for the first byte of audio: until then a failure (the app's or ffmpeg's) is a
 * JSON error with its status. Past it an audio body cannot carry an error, so the transfer is cut
 * and the client sees it truncated; an event stream ends with an `error` event.
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process"
import type { ServerResponse } from "node:http"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import type { SpeechFormat } from "../../app-runtime/schemas/Speech.js"
import { lastLines, videoTools } from "../../executors/common/media/VideoContainer.js"
import { wavHeader } from "../../executors/common/media/Wav.js"
import { AppFailed, NotSupported } from "../errors.js"
import { errorBody, type GatewayError } from "./ErrorResponse.js"
import { errorCodes, type ReplyFormat, sendError } from "./ReplyFormat.js"

/** OpenAI's `pcm` is 24 kHz, and its clients play it at that rate without being told. */
const pcmRate = 24_000

/**
 * One element of a speech app's stream: PCM16 little-endian mono samples, base64, at the model's
 * rate. A rate no speech model uses is the app's failure: ffmpeg would refuse it, or resample a
 * few hertz into thousands of times its input.
 */
const SpeechChunk = Schema.Struct({
  audio: Schema.String,
  sampleRate: Schema.Int.pipe(Schema.between(1_000, 384_000))
})

const decodeChunk = Schema.decodeUnknownEither(Schema.parseJson(SpeechChunk))

/** The samples of one element of the app's stream, or why it is not audio. */
const samplesOf = (json: string): { readonly samples: Buffer; readonly sampleRate: number } | string => {
  const decoded = decodeChunk(json)
  if (Either.isLeft(decoded)) {
    return "the app streamed something other than audio chunks ({ audio: base64 of PCM16 samples, sampleRate })"
  }
  const { audio, sampleRate } = decoded.right
  // Node decodes any text as base64, skipping what is not; a round trip tells audio from garbage.
  const samples = Buffer.from(audio, "base64")
  if (samples.toString("base64") !== audio) return "the app streamed audio that is not base64"
  if (samples.length % 2 !== 0) return "the app streamed audio that is not whole 16-bit samples"
  return { samples, sampleRate }
}

/** How ffmpeg writes one format: its media type, its output options, the input rates its encoder takes. */
interface Encoding {
  readonly contentType: string
  readonly output: ReadonlyArray<string>
  readonly takes: (sampleRate: number) => boolean
  /** The rate ffmpeg resamples to where the encoder does not take the model's. */
  readonly fallbackRate: number
}

const oneOf =
  (...rates: ReadonlyArray<number>) =>
  (sampleRate: number) =>
    rates.includes(sampleRate)

const encodings: Readonly<Record<Exclude<SpeechFormat, "wav">, Encoding>> = {
  mp3: {
    contentType: "audio/mpeg",
    output: ["-c:a", "libmp3lame", "-f", "mp3"],
    takes: oneOf(8_000, 11_025, 12_000, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000),
    fallbackRate: 24_000
  },
  opus: {
    contentType: "audio/ogg",
    // Ogg pages of 100 ms rather than the muxer's second: the client hears the first words sooner.
    output: ["-c:a", "libopus", "-page_duration", "100000", "-f", "ogg"],
    takes: oneOf(8_000, 12_000, 16_000, 24_000, 48_000),
    fallbackRate: 48_000
  },
  aac: {
    contentType: "audio/aac",
    output: ["-c:a", "aac", "-f", "adts"],
    takes: oneOf(7_350, 8_000, 11_025, 12_000, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000, 64_000, 88_200, 96_000),
    fallbackRate: 24_000
  },
  flac: {
    contentType: "audio/flac",
    output: ["-c:a", "flac", "-f", "flac"],
    // The rates a FLAC frame header can name.
    takes: (sampleRate) => sampleRate <= 65_535 || sampleRate % 10 === 0,
    fallbackRate: 48_000
  },
  pcm: {
    contentType: "audio/pcm",
    output: ["-f", "s16le"],
    takes: (sampleRate) => sampleRate === pcmRate,
    fallbackRate: pcmRate
  }
}

/** How long ffmpeg may write nothing once the audio has ended and the client is reading. */
const encoderIdleMs = 30_000

/** The end of ffmpeg's stderr kept for an error's message: its reason comes last. */
const maxStderrChars = 8 * 1024

/**
 * An ffmpeg child encoding PCM16 from its stdin into `encoding` on its stdout. `onOutput` takes
 * each piece of output and says, as `write` does, whether it left at once; `onDone` hears once
 * how it ended (why, when it failed), unless `kill` ended it.
 */
class Encoder {
  private readonly child: ChildProcessWithoutNullStreams
  private stderr = ""
  private stopped = false
  private inputClosed = false
  private outputPaused = false
  private awaitingInputDrain = false
  private idleTimer: NodeJS.Timeout | undefined

  constructor(
    sampleRate: number,
    encoding: Encoding,
    private readonly response: ServerResponse,
    onOutput: (bytes: Buffer) => boolean,
    private readonly onDone: (failure: string | undefined) => void
  ) {
    const resample = encoding.takes(sampleRate) ? [] : ["-ar", String(encoding.fallbackRate)]
    this.child = spawn(
      videoTools().ffmpeg,
      [
        "-hide_banner",
        "-loglevel",
        "error",
        // Raw samples need no probing; without these ffmpeg reads seconds of input before its first output.
        "-probesize",
        "32",
        "-analyzeduration",
        "0",
        "-f",
        "s16le",
        "-ar",
        String(sampleRate),
        "-ac",
        "1",
        "-i",
        "pipe:0",
        ...resample,
        ...encoding.output,
        "-flush_packets",
        "1",
        "pipe:1"
      ],
      { stdio: ["pipe", "pipe", "pipe"], env: { PATH: process.env.PATH ?? "" } }
    )
    // A write to an ffmpeg that has exited fails (EPIPE); its exit says why.
    this.child.stdin.on("error", () => undefined)
    this.child.stdout.on("data", (bytes: Buffer) => {
      if (this.stopped) return
      this.watchIdle()
      if (onOutput(bytes)) return
      // A slow client holds ffmpeg back: its stdout pipe fills, it stops reading its stdin, and
      // `write` below stops accepting, so nothing piles up in this process.
      this.child.stdout.pause()
      this.outputPaused = true
      this.watchIdle()
      this.response.once("drain", () => {
        this.outputPaused = false
        this.child.stdout.resume()
        this.watchIdle()
      })
    })
    this.child.stderr.setEncoding("utf8")
    this.child.stderr.on("data", (text: string) => {
      this.stderr = (this.stderr + text).slice(-maxStderrChars)
    })
    this.child.once("error", (error: NodeJS.ErrnoException) => {
      this.finish(`cannot run ffmpeg (${error.code ?? error.message}); install ffmpeg or set CORNSERVE_FFMPEG`)
    })
    this.child.once("close", (code, signal) => {
      if (code === 0 && this.inputClosed) return this.finish(undefined)
      const reason = lastLines(this.stderr, "pipe:0")
      const exit = code === null ? `ffmpeg was killed (${signal})` : `ffmpeg exited with code ${code}`
      this.finish(reason === "" ? exit : `${exit}: ${reason}`)
    })
  }

  /**
   * Hands samples to ffmpeg; false while its stdin is full. The gateway then waits for the
   * response's `drain` before the app may send more, so that is what this emits once ffmpeg has
   * taken them: the app is held back by the encoder, and through it by the client, and memory
   * stays bounded by the pipes' buffers whatever the app's pace.
   */
  write(samples: Buffer): boolean {
    if (this.stopped || samples.length === 0) return true
    if (this.child.stdin.write(samples)) return true
    if (!this.awaitingInputDrain) {
      this.awaitingInputDrain = true
      this.child.stdin.once("drain", () => {
        this.awaitingInputDrain = false
        this.response.emit("drain")
      })
    }
    return false
  }

  /** The audio has ended: ffmpeg flushes what it holds, then exits. */
  close(): void {
    if (this.stopped || this.inputClosed) return
    this.inputClosed = true
    this.child.stdin.end()
    this.watchIdle()
  }

  kill(): void {
    if (this.stopped) return
    this.stopped = true
    clearTimeout(this.idleTimer)
    this.child.kill("SIGKILL")
  }

  /**
   * Once its input has ended nothing else bounds ffmpeg (the gateway's timeout covers the app's
   * stream only), so it is given a time to write something; a client that is not reading is not
   * ffmpeg's delay, and stops the clock.
   */
  private watchIdle(): void {
    clearTimeout(this.idleTimer)
    if (this.stopped || !this.inputClosed || this.outputPaused) return
    this.idleTimer = setTimeout(() => {
      this.child.kill("SIGKILL")
      this.finish(`ffmpeg wrote nothing for ${encoderIdleMs / 1000} s after the audio ended`)
    }, encoderIdleMs)
  }

  private finish(failure: string | undefined): void {
    if (this.stopped) return
    this.stopped = true
    clearTimeout(this.idleTimer)
    this.onDone(failure)
  }
}

const doneEvent = `data: ${JSON.stringify({
  type: "speech.audio.done",
  usage: { input_tokens: 0, output_tokens: 0, total_tokens: 0 }
})}\n\n`

/** One request's reply: its audio's rate once known, its encoder, whether it has ended. */
class SpeechReply {
  private sampleRate: number | undefined
  private encoder: Encoder | undefined
  /** The wav header, sent with the first samples. */
  private preamble: Buffer | undefined
  private finished = false

  constructor(
    private readonly response: ServerResponse,
    private readonly requestId: string | undefined,
    private readonly appId: string,
    private readonly format: SpeechFormat,
    private readonly events: boolean
  ) {
    // Also after a complete reply, where ffmpeg has exited already; before, the client has gone.
    response.once("close", () => {
      this.finished = true
      this.encoder?.kill()
    })
  }

  chunk(json: string): boolean {
    if (this.finished) return true
    const chunk = samplesOf(json)
    if (typeof chunk === "string") return this.appFailed(chunk)
    if (this.sampleRate === undefined) this.open(chunk.sampleRate)
    else if (chunk.sampleRate !== this.sampleRate) {
      return this.appFailed(
        `the app's audio changed its sample rate midway, from ${this.sampleRate} Hz to ${chunk.sampleRate} Hz`
      )
    }
    return this.encoder === undefined ? this.emit(chunk.samples) : this.encoder.write(chunk.samples)
  }

  end(): void {
    if (this.finished) return
    if (this.sampleRate === undefined) {
      // No audio at all: still a valid file, of no samples.
      this.open(pcmRate)
      if (this.format === "wav") this.preamble = wavHeader(pcmRate, 0)
    }
    if (this.encoder !== undefined) this.encoder.close()
    else {
      this.emit(Buffer.alloc(0))
      this.complete()
    }
  }

  fail(error: GatewayError): void {
    if (this.finished) return
    this.finished = true
    this.encoder?.kill()
    if (!this.response.headersSent && !this.response.destroyed) {
      sendError(this.response, error)
      return
    }
    errorCodes.set(this.response, error._tag)
    if (this.response.destroyed) return
    if (this.events) this.response.end(`data: ${JSON.stringify({ type: "error", ...errorBody(error) })}\n\n`)
    else this.response.destroy()
  }

  private appFailed(message: string): true {
    this.fail(new AppFailed({ appId: this.appId, message }))
    return true
  }

  private open(sampleRate: number): void {
    this.sampleRate = sampleRate
    if (this.format === "wav") {
      this.preamble = wavHeader(sampleRate)
      return
    }
    const encoding = encodings[this.format]
    if (this.format === "pcm" && encoding.takes(sampleRate)) return
    this.encoder = new Encoder(
      sampleRate,
      encoding,
      this.response,
      (bytes) => this.emit(bytes),
      (failure) => {
        if (failure === undefined) return this.complete()
        this.fail(new NotSupported({ message: `the gateway could not encode the audio as ${this.format}: ${failure}` }))
      }
    )
  }

  /** Writes audio bytes, the headers and the wav header first; false, as `write`, when they wait. */
  private emit(bytes: Buffer): boolean {
    const body = this.preamble === undefined ? bytes : Buffer.concat([this.preamble, bytes])
    this.preamble = undefined
    if (this.finished || body.length === 0) return true
    this.writeHead()
    if (!this.events) return this.response.write(body)
    return this.response.write(
      `data: ${JSON.stringify({ type: "speech.audio.delta", audio: body.toString("base64") })}\n\n`
    )
  }

  private complete(): void {
    if (this.finished) return
    this.finished = true
    this.writeHead()
    if (this.events) this.response.end(doneEvent)
    else this.response.end()
  }

  private writeHead(): void {
    if (this.response.headersSent) return
    const contentType = this.events
      ? "text/event-stream"
      : this.format === "wav"
        ? "audio/wav"
        : encodings[this.format].contentType
    this.response.writeHead(200, {
      "content-type": contentType,
      "cache-control": "no-cache",
      ...(this.requestId === undefined ? {} : { "x-request-id": this.requestId })
    })
  }
}

/**
 * Writes a speech app's stream of `{ audio, sampleRate }` chunks (base64 PCM16 mono) as the audio
 * file `format` names, streamed as the chunks arrive, or as `speech.audio.delta` events of that
 * file's bytes when `streamFormat` is `sse`. Anything else from the app is its failure.
 */
export const speechFormat = (appId: string, format: SpeechFormat, streamFormat: "audio" | "sse"): ReplyFormat => {
  const replies = new WeakMap<ServerResponse, SpeechReply>()
  const replyOf = (response: ServerResponse, requestId?: string): SpeechReply => {
    const known = replies.get(response)
    if (known !== undefined) return known
    const reply = new SpeechReply(response, requestId, appId, format, streamFormat === "sse")
    replies.set(response, reply)
    return reply
  }
  return {
    value: (response) =>
      sendError(
        response,
        new AppFailed({
          appId,
          message: "the app answered a speech request with something other than a stream of audio chunks"
        })
      ),
    streamStart: (response, requestId) => void replyOf(response, requestId),
    chunk: (response, json) => replyOf(response).chunk(json),
    end: (response) => replyOf(response).end(),
    streamError: (response, error) => replyOf(response).fail(error)
  }
}

export { wavHeader }
