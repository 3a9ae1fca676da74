import { defineConfig } from "vitest/config"
import base from "./vitest.config.js"

/**
 * `npm run test:unit`: the tests that start no process, in about a minute; `npm test` runs them with
 * the rest. A file that starts processes (a platform, an executor, a sidecar, ffmpeg, npm, a network
 * namespace) is excluded here by name, and test/support/noProcesses.ts fails a test here that starts
 * one.
 */
const workers = base.test?.maxWorkers

export default defineConfig({
  test: {
    ...base.test,
    exclude: [
      // Integration tests start platforms; the files below start executors, sidecars, ffmpeg, npm
      // or the CLI, or measure their own process's memory.
      "test/integration/**",
      // Measures the growth of JavaScript's array buffers while it opens a model: another file's
      // garbage in a shared worker would be counted.
      "test/models/weightsInPlace.test.ts",
      "test/app-runtime/compiler.test.ts",
      "test/cli/appBundle.test.ts",
      "test/cli/models.test.ts",
      "test/cli/serve.test.ts",
      "test/cli/usability.test.ts",
      "test/control/app-manager/runtimeLinks.test.ts",
      "test/control/gateway/speechApi.test.ts",
      "test/control/resource-manager/resourceManager.test.ts",
      "test/deploy/manifests.test.ts",
      "test/executors/common/media/audioContainer.test.ts",
      "test/executors/common/media/mediaProcess.test.ts",
      "test/executors/common/media/videoContainer.test.ts",
      "test/executors/common/media/videoTools.test.ts",
      "test/executors/eric/eric.test.ts",
      "test/executors/eric/ericVideo.test.ts",
      "test/executors/eric/sharedTowerExecutor.test.ts",
      "test/executors/eric/textEmbeddings.test.ts",
      "test/executors/geri/geri.test.ts",
      "test/executors/llm/hiddenStatesMrope.test.ts",
      "test/executors/llm/kvTransfer.test.ts",
      "test/executors/llm/packedWeightsExecutor.test.ts",
      "test/executors/llm/llmExecutor.test.ts",
      "test/executors/llm/sampling.test.ts",
      "test/executors/llm/sidecar.test.ts",
      "test/executors/llm/talkerExecutor.test.ts",
      "test/metrics/footprint.test.ts",
      "test/models/modelStore.test.ts",
      "test/models/modelsCli.test.ts",
      "test/process/supervisedProcess.test.ts",
      "test/sidecar/crossNode.test.ts",
      "test/sidecar/peerHandshake.test.ts",
      "test/sidecar/sidecar.test.ts",
      "test/support/reaper/reaper.test.ts",
      // Slow rather than spawning: transformers.js references over real tokenizers and Whisper
      // decoding, 10-26 s each; the full suite runs them.
      "test/models/tokenizers.test.ts",
      "test/models/specialTokenText.test.ts",
      "test/executors/eric/speechRecognizer.test.ts",
      "test/executors/eric/textEncoder.test.ts"
    ],
    // The files share workers: a worker imports effect, the tokenizers and the ONNX builder once for
    // many files, not once per file (measured on two cores: 35-45 s instead of 69, 74 CPU-s instead
    // of 125). (In the full suite, the same made the run slower: 710 s instead of 547.)
    isolate: false,
    // As many workers from the start to the end: a pool that shrinks terminates an idle fork, which
    // a shared lane may be about to reuse (vitest then reports "Terminating worker thread").
    minWorkers: workers,
    // No process to reap: the full suite's reaper (and its watchdog process) stays out.
    globalSetup: [],
    setupFiles: ["test/support/noProcesses.ts", "test/support/testEnv.ts"]
  }
})
