import type { AudioChatProcessor } from "../../../models/UltravoxProcessor.js"
import type { ThreadPool } from "../ThreadPool.js"
import type { MediaLimits } from "./MediaLimits.js"
import type { Preprocessed } from "./preprocess.js"

/**
 * A clip as Ultravox or Voxtral takes it, made in the thread pool (preprocess.ts's `ultravoxAudio`
 * or `voxtralAudio`): what Eric and the LLM executor both ask, the one encoding the clip, the other
 * when it encodes it itself.
 */
export const ultravoxAudioJob = (
  pool: ThreadPool,
  input: {
    readonly bytes: Uint8Array
    readonly mimeType: string | undefined
    readonly preprocessorConfig: unknown
    readonly ultravox: AudioChatProcessor
    readonly limits: MediaLimits
    /** Ends the job: its request ended. */
    readonly signal?: AbortSignal
  }
): Promise<Preprocessed> => {
  const { bytes, mimeType, preprocessorConfig, limits } = input
  const processor = input.ultravox
  // The extractor's tables are built again in the thread, from the config.
  return processor.kind === "voxtral"
    ? pool.run<Preprocessed>("voxtralAudio", { bytes, mimeType, preprocessorConfig, limits }, { signal: input.signal })
    : pool.run<Preprocessed>(
        "ultravoxAudio",
        {
          bytes,
          mimeType,
          preprocessorConfig,
          audio: {
            placeholder: processor.placeholder,
            encoderDownsampling: processor.encoderDownsampling,
            stackFactor: processor.stackFactor
          },
          limits
        },
        { signal: input.signal }
      )
}
