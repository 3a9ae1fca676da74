/**
 * Which files `npm run test:unit` (vitest.unit.config.ts) leaves to the full suite: test/integration/,
 * the files below that start processes (platforms, executors, sidecars, ffmpeg, npm, the CLI) or
 * measure their own process's memory, and a few slow ones. The unit lane's files share workers,
 * where test/support/noProcesses.ts makes a test that starts a process fail: such a file belongs in
 * `spawningFiles`.
 */

/** Start no process, but take 10-26 s each (transformers.js references over real tokenizers, Whisper decoding): the full suite runs them, the unit lane does not. */
export const slowInProcessFiles = [
  "test/models/tokenizers.test.ts",
  "test/models/specialTokenText.test.ts",
  "test/executors/eric/speechRecognizer.test.ts",
  "test/executors/eric/textEncoder.test.ts"
]

/** Outside test/integration/, the files that start processes, or measure their own process's memory. */
export const spawningFiles = [
  // Measures the growth of JavaScript's array buffers while it opens a model: another file's
  // garbage in a shared worker would be counted.
  "test/models/weightsInPlace.test.ts",
  "test/app-runtime/compiler.test.ts",
  "test/cli/appBundle.test.ts",
  "test/cli/models.test.ts",
  "test/cli/serve.test.ts",
  "test/cli/usability.test.ts",
  "test/control/gateway/speechApi.test.ts",
  "test/control/resource-manager/resourceManager.test.ts",
  "test/deploy/manifests.test.ts",
  "test/executors/common/media/audioContainer.test.ts",
  "test/executors/common/media/mediaProcess.test.ts",
  "test/executors/common/media/videoContainer.test.ts",
  "test/executors/common/media/videoTools.test.ts",
  "test/executors/eric/eric.test.ts",
  "test/executors/eric/ericVideo.test.ts",
  "test/executors/eric/textEmbeddings.test.ts",
  "test/executors/geri/geri.test.ts",
  "test/executors/llm/llmExecutor.test.ts",
  "test/executors/llm/sampling.test.ts",
  "test/executors/llm/sidecar.test.ts",
  "test/metrics/footprint.test.ts",
  "test/models/modelStore.test.ts",
  "test/models/modelsCli.test.ts",
  "test/process/supervisedProcess.test.ts",
  "test/sidecar/crossNode.test.ts",
  "test/sidecar/peerHandshake.test.ts",
  "test/sidecar/sidecar.test.ts",
  "test/support/reaper/reaper.test.ts"
]
