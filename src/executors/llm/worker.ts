/**
 * The LLM executor's worker: a Runner on its device, driven one step at a time by the LLM engine.
 * Each batch the framework hands it is one step; its tokens go back as partial results the moment
 * they are sampled. Prompt embeddings go to the sidecar under the request's id.
 */
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import type { LoadWorkerModel } from "../common/WorkerModel.js"
import type { EmbedResult, StepOp } from "./protocol.js"
import { Runner } from "./Runner.js"

export const load: LoadWorkerModel = async ({ config, device }) => {
  const runner = await Runner.open(
    await loadModelDirectory(config.modelDir),
    device,
    config.threadsPerDevice,
    config.dtype
  )
  const sidecar = config.sidecarSocket === undefined ? undefined : await SidecarClient.connect(config.sidecarSocket)

  return {
    async run({ items, emit }) {
      const outputs = await runner.step(
        items.map((item) => ({ id: item.requestId, op: item.meta as StepOp })),
        emit
      )
      return Promise.all(
        items.map(async (item, index): Promise<EmbedResult | undefined> => {
          const output = outputs[index]
          const op = item.meta as StepOp
          if (output === undefined || op.op !== "embed") return undefined
          if ("error" in output) return { error: output.error }
          if (op.inline) return { shape: output.shape, embedding: output.embedding }
          if (sidecar === undefined) return { error: 'this executor has no sidecar; ask for return: "inline"' }
          await sidecar.send(op.id, new Tensor("float32", output.shape, output.embedding), { to: op.receivers })
          return { shape: output.shape }
        })
      )
    },
    async close() {
      await runner.close()
      await sidecar?.close()
    }
  }
}
