/**
 * Compressed and containered audio (mp3, AAC, ogg with Vorbis or Opus, flac, m4a, webm) decoded by
 * ffmpeg as a child process, the way VideoContainer.ts decodes video: the bytes go to a private
 * temporary file; ffprobe reads the header first and the duration and sample rate are checked from
 * it before a sample is decoded; ffmpeg then decodes the first audio stream, mixed down to mono (the
 * channels' mean) and resampled to the model's rate by its own band-limited resampler (swresample's
 * windowed sinc), as 32-bit float, bounded as MediaProcess.ts bounds its children and in output
 * bytes (by the duration the limit allows at the model's rate, so that a small file of a long clip
 * at a high rate cannot fill the memory). The demuxer is the one the bytes' signature names and the
 * only protocol `file`.
 */
import { writeFile } from "node:fs/promises"
import { join } from "node:path"
import { MediaError, MediaTooLarge } from "./errors.js"
import type { MediaLimits } from "./MediaLimits.js"
import { runBounded, withScratchDirectory } from "./MediaProcess.js"
import { decodeTimeoutMs, lastLines, positive, probeHeader, videoTools } from "./VideoContainer.js"

/** ffmpeg's demuxer for each audio format this module reads; WAV is read in process. */
export type AudioDemuxer = "wav" | "mp3" | "aac" | "ogg" | "flac" | "mov" | "matroska"

const ascii = (bytes: Uint8Array, from: number, to: number) => Buffer.from(bytes.subarray(from, to)).toString("latin1")

/** The audio format of `bytes`, from their first bytes; undefined for anything else. */
export const audioDemuxerOf = (bytes: Uint8Array): AudioDemuxer | undefined => {
  if (bytes.length < 4) return undefined
  if (bytes.length >= 12 && ascii(bytes, 0, 4) === "RIFF" && ascii(bytes, 8, 12) === "WAVE") return "wav"
  if (ascii(bytes, 0, 3) === "ID3") return "mp3"
  if (ascii(bytes, 0, 4) === "OggS") return "ogg"
  if (ascii(bytes, 0, 4) === "fLaC") return "flac"
  if (bytes[0] === 0x1a && bytes[1] === 0x45 && bytes[2] === 0xdf && bytes[3] === 0xa3) return "matroska"
  if (bytes.length >= 8 && ascii(bytes, 4, 8) === "ftyp") return "mov"
  // MPEG audio frame sync (11 bits set): layer bits 00 are AAC in ADTS, the others MPEG layers I–III.
  if (bytes[0] === 0xff && (bytes[1]! & 0xe0) === 0xe0) return (bytes[1]! & 0x06) === 0 ? "aac" : "mp3"
  return undefined
}

/** The sample rates a clip may have: those recorders and codecs use, from telephony to studio. */
export const audioSampleRates = { min: 8_000, max: 192_000 } as const

/** Channels a clip may have (7.1 is 8; ambisonic recordings go higher). */
const maxChannels = 64

interface AudioProbe {
  readonly format: string
  readonly codec: string
  readonly sampleRate: number
  readonly channels: number
  readonly durationSeconds: number | undefined
}

const probe = async (demuxer: AudioDemuxer, path: string): Promise<AudioProbe> => {
  const { format, container, stream } = await probeHeader(
    demuxer,
    path,
    "audio",
    "a:0",
    "format=format_name,duration:stream=codec_name,sample_rate,channels,duration"
  )
  if (stream === undefined) throw new MediaError({ message: `the ${format} file has no audio stream` })
  const sampleRate = positive(stream.sample_rate)
  const channels = positive(stream.channels)
  if (sampleRate === undefined || channels === undefined) {
    throw new MediaError({ message: `the ${format} file's audio stream declares no sample rate or channels` })
  }
  return {
    format,
    codec: typeof stream.codec_name === "string" ? stream.codec_name : "unknown",
    sampleRate,
    channels,
    durationSeconds: positive(stream.duration) ?? positive(container.duration)
  }
}

/**
 * Mono float samples of the first audio stream of `bytes`, at `sampleRate`. Refused
 * before decoding: a clip whose header declares more than the limit's seconds or a rate outside
 * 8–192 kHz; while decoding: one that decodes to more samples than the limit allows (a header
 * that lies), or fails to decode (MediaError, with ffmpeg's reason).
 */
export const decodeAudioContainer = (
  bytes: Uint8Array,
  demuxer: Exclude<AudioDemuxer, "wav">,
  sampleRate: number,
  limits: MediaLimits
): Promise<Float32Array> =>
  withScratchDirectory("audio", async (directory) => {
    const path = join(directory, "input")
    await writeFile(path, bytes, { mode: 0o600 })
    const audio = await probe(demuxer, path)
    if (audio.sampleRate < audioSampleRates.min || audio.sampleRate > audioSampleRates.max) {
      throw new MediaError({
        message: `the audio's sample rate of ${audio.sampleRate} Hz is outside ${audioSampleRates.min}–${audioSampleRates.max} Hz`
      })
    }
    if (audio.channels > maxChannels) {
      throw new MediaError({
        message: `the audio has ${audio.channels} channels; at most ${maxChannels} are mixed down`
      })
    }
    if (audio.durationSeconds !== undefined && audio.durationSeconds > limits.maxAudioSeconds) {
      throw new MediaTooLarge({
        message: `the audio lasts ${audio.durationSeconds.toFixed(1)} s, longer than the limit of ${limits.maxAudioSeconds} s`
      })
    }
    // The limit's seconds of mono float32 at the model's rate, and a second over for codec padding.
    const maxBytes = Math.ceil((limits.maxAudioSeconds + 1) * sampleRate) * 4
    const chunks: Array<Buffer> = []
    const { code, stderr } = await runBounded(
      videoTools().ffmpeg,
      [
        "-v",
        "error",
        "-nostdin",
        "-protocol_whitelist",
        "file",
        "-f",
        demuxer,
        "-i",
        path,
        "-map",
        "0:a:0",
        // The channels' mean, as a WAV is mixed down (ffmpeg's own downmix to mono keeps the power instead).
        "-af",
        `pan=mono|c0=${Array.from({ length: audio.channels }, (_, c) => `${1 / audio.channels}*c${c}`).join("+")},aresample=${sampleRate}`,
        "-f",
        "f32le",
        "-acodec",
        "pcm_f32le",
        "pipe:1"
      ],
      { timeoutMs: decodeTimeoutMs, maxStdoutBytes: maxBytes, what: "audio" },
      (chunk) => chunks.push(chunk)
    ).catch((error: unknown) => {
      if (error instanceof MediaError && /more data than its header/.test(error.message)) {
        throw new MediaTooLarge({ message: `the audio is longer than the limit of ${limits.maxAudioSeconds} s` })
      }
      throw error
    })
    if (code !== 0) {
      throw new MediaError({
        message: `the audio could not be decoded: ${lastLines(stderr, path) || `ffmpeg exited with ${code}`}`
      })
    }
    const raw = Buffer.concat(chunks)
    const samples = new Float32Array(Math.floor(raw.length / 4))
    for (let i = 0; i < samples.length; i++) samples[i] = raw.readFloatLE(i * 4)
    if (samples.length === 0) throw new MediaError({ message: `the ${audio.format} file decoded to no samples` })
    if (samples.length / sampleRate > limits.maxAudioSeconds) {
      throw new MediaTooLarge({ message: `the audio is longer than the limit of ${limits.maxAudioSeconds} s` })
    }
    return samples
  })
