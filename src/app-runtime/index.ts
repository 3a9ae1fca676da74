/**
 * The SDK apps import as `cornserve/app`: define an app, declare the tasks it calls, and use the
 * OpenAI schemas for chat and embeddings apps.
 */
export { defineApp, type AdmissionSettings, type App, type AppDefinition, type ServeContext } from "./App.js"
export { outbound, OutboundError, type OutboundRequestInit } from "./Outbound.js"
export { DataForward, type ForwardedDataType } from "./tasks/DataForward.js"
export { TaskStream } from "./tasks/TaskStream.js"
export { Task, UnitTask, CompositeTask, TaskConfigError, type UnitTaskKind } from "./tasks/Task.js"
export { TaskExecutionError, TaskInputError } from "./tasks/TaskGraph.js"
export { EncoderTask, type EncoderConfig, type EncoderInput, type EncoderOutput } from "./tasks/EncoderTask.js"
export {
  TextEmbeddingTask,
  type TextEmbeddingConfig,
  type TextEmbeddingInput,
  type TextPooling
} from "./tasks/TextEmbeddingTask.js"
export {
  SpeechRecognitionTask,
  type SpeechRecognitionConfig,
  type SpeechRecognitionInput
} from "./tasks/SpeechRecognitionTask.js"
export {
  CodecDecoderTask,
  type CodecDecoderConfig,
  type CodecDecoderInput
} from "./tasks/CodecDecoderTask.js"
export {
  SpeechSynthesisTask,
  type SpeechSynthesisConfig,
  type SpeechSynthesisInput
} from "./tasks/SpeechSynthesisTask.js"
export {
  LLMTask,
  LLMEmbeddingTask,
  LLMImageTokensTask,
  type LLMConfig,
  type LLMInput,
  type LLMEmbeddingInput,
  type LLMEmbeddingOutput,
  type LLMEmbeddingTaskOptions,
  type PromptEmbeddingSource,
  type LLMImageTokensInput,
  type LLMImageTokensOutput
} from "./tasks/LLMTask.js"
export {
  ImageGeneratorTask,
  AudioGeneratorTask,
  type GeneratorConfig,
  type ImageGeneratorInput,
  type ImageGeneratorOutput,
  type AudioGeneratorInput,
  type AudioChunk
} from "./tasks/GeneratorTask.js"
export {
  TalkerTask,
  type TalkerInput,
  type TalkerFrame,
  type TalkerOutput,
  type TalkerText,
  type TalkerTextDone
} from "./tasks/TalkerTask.js"
export { DisaggregatedMLLMTask, MLLMTask, type MLLMConfig } from "./tasks/MLLMTask.js"
export {
  DecodeLLMTask,
  DisaggregatedLLMTask,
  PrefillLLMTask,
  type DecodeLLMInput,
  type DisaggregatedLLMConfig,
  type PrefillLLMOutput
} from "./tasks/DisaggregatedLLMTask.js"
export {
  ChatCompletionRequest,
  ChatCompletionChunk,
  ChatMessage,
  ChatContentPart,
  chatMediaParts
} from "./schemas/OpenAI.js"
export { EmbeddingRequest, EmbeddingResponse, type Embedding, type EmbeddingUsage } from "./schemas/Embeddings.js"
export {
  TranscriptionRequest,
  Transcription,
  TranscriptionSegment,
  TranscriptionFormat
} from "./schemas/Transcriptions.js"
export { SpeechRequest, SpeechFormat, maxSpeechInputChars } from "./schemas/Speech.js"
export { ImageGenerationRequest, ImagesResponse, ImageSize, imageSizeOf } from "./schemas/Images.js"
