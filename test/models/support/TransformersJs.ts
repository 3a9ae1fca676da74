import { basename, dirname } from "node:path"
import { AutoModelForCausalLM, env, Tensor } from "@huggingface/transformers"

/**
 * transformers.js, the reference implementation, run offline on a local model directory: models
 * load only from disk, never from the hub.
 */

export const offline = (modelDir: string) => {
  env.allowRemoteModels = false
  env.allowLocalModels = true
  env.localModelPath = dirname(modelDir)
  return basename(modelDir)
}

/** Greedy completions by transformers.js's own generate(), one prompt at a time: the generated ids only. */
export const transformersGreedy = async (
  modelDir: string,
  dtype: string,
  prompts: ReadonlyArray<ReadonlyArray<number>>,
  maxNewTokens: number
): Promise<Array<Array<number>>> => {
  const model = await AutoModelForCausalLM.from_pretrained(offline(modelDir), { dtype: dtype as "fp32" })
  try {
    const answers: Array<Array<number>> = []
    for (const prompt of prompts) {
      const ids = BigInt64Array.from(prompt, BigInt)
      const output = (await model.generate({
        input_ids: new Tensor("int64", ids, [1, prompt.length]),
        attention_mask: new Tensor("int64", new BigInt64Array(prompt.length).fill(1n), [1, prompt.length]),
        max_new_tokens: maxNewTokens,
        do_sample: false
      })) as Tensor
      answers.push(Array.from(output.data as BigInt64Array, Number).slice(prompt.length))
    }
    return answers
  } finally {
    await model.dispose()
  }
}
