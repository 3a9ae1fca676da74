import { describe, expect, it } from "vitest"
import { platformLaunch } from "../../../src/executors/common/ExecutorCommand.js"
import { executorDefaults } from "../../../src/executors/common/ExecutorConfig.js"
import { defaultMaxMediaItems, defaultMediaLimits } from "../../../src/executors/common/media/MediaLimits.js"

/** The command line a node agent starts a router with (NodeAgent's startExecutor). */
const agentArgs = [
  "--kind",
  "llm",
  "--model",
  "cornserve/tiny-color-vlm",
  "--devices",
  "cpu:0,cpu:1",
  "--sidecar-socket",
  "/run/sidecar.sock",
  "--run-dir",
  "/run/executor-3",
  "--host",
  "10.0.0.2",
  "--dtype",
  "q4",
  "--settings",
  '{"maxBatchSize":4}'
]

describe("a router started by its node agent, without the CLI", () => {
  it("takes the agent's flags and gives every other field the CLI's default", () => {
    expect(platformLaunch(agentArgs)).toEqual({
      ...executorDefaults,
      ...defaultMediaLimits,
      maxMediaItems: defaultMaxMediaItems,
      allowPrivateHosts: false,
      kind: "llm",
      model: "cornserve/tiny-color-vlm",
      devices: ["cpu:0", "cpu:1"],
      sidecarSocket: "/run/sidecar.sock",
      runDir: "/run/executor-3",
      host: "10.0.0.2",
      dtype: "q4",
      settings: '{"maxBatchSize":4}'
    })
    expect(platformLaunch(["--kind", "eric", "--model", "m"])).toMatchObject({
      devices: ["cpu:0"],
      host: "127.0.0.1",
      port: 0
    })
  })

  it("leaves every other command line to the CLI, which parses it, explains it or refuses it", () => {
    for (const args of [
      [...agentArgs, "--max-batch-size", "4"],
      [...agentArgs, "--help"],
      [...agentArgs, "extra"],
      ["--kind", "eric"],
      ["--model", "m"],
      ["--kind", "vae", "--model", "m"],
      ["--kind", "llm", "--model", "m", "--dtype", "fp128"],
      ["--kind"]
    ])
      expect(platformLaunch(args), args.join(" ")).toBeUndefined()
  })
})
