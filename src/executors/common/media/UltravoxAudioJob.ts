import type { UltravoxAudio } from "../../../models/UltravoxProcessor.js"
import type { ThreadPool } from "../ThreadPool.js"
import type { MediaLimits } from "./MediaLimits.js"
import type { Preprocessed } from "./preprocess.js"

/**
 * A clip as Ultravox takes it, made in the thread pool (preprocess.ts's `ultravoxAudio`): what Eric
 * and the LLM executor both ask, the one encoding the clip, the other when it encodes it itself.
 */
export const ultravoxAudioJob = (
  pool: ThreadPool,
  input: {
    readonly bytes: Uint8Array
    readonly mimeType: string | undefined
    readonly preprocessorConfig: unknown
    readonly ultravox: UltravoxAudio
    readonly limits: MediaLimits
    /** Ends the job: its request ended. */
    readonly signal?: AbortSignal
  }
): Promise<Preprocessed> =>
  pool.run<Preprocessed>(
    "ultravoxAudio",
    {
      bytes: input.bytes,
      mimeType: input.mimeType,
      preprocessorConfig: input.preprocessorConfig,
      // The extractor's tables are built again in the thread, from the config.
      audio: {
        placeholder: input.ultravox.placeholder,
        encoderDownsampling: input.ultravox.encoderDownsampling,
        stackFactor: input.ultravox.stackFactor
      },
      limits: input.limits
    },
    { signal: input.signal }
  )
