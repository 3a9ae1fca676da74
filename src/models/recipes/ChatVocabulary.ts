import { type ByteLevelBpe, byteLevelBpe } from "../ByteLevelBpe.js"
import { colors } from "./ColorChannels.js"

/**
 * The tokenizer the constructed chat models share: byte-level BPE with single tokens for the words
 * their prompts and answers use, ChatML special tokens, and one placeholder token per modality.
 */

export const specialTokens = {
  endOfText: "<|endoftext|>",
  imStart: "<|im_start|>",
  imEnd: "<|im_end|>",
  image: "<image>",
  audio: "<audio>"
} as const

/** Words a model answers with; they begin the assistant turn, so they carry no leading space. */
export const answerWords = [...colors.map((color) => color.name), "low", "high", "nothing"] as const

const capitalized = (word: string) => word[0]!.toUpperCase() + word.slice(1)

/** Colour names as they appear in prompts: any case of the first letter, after a space or not. */
export const colorWordVariants = (name: string): ReadonlyArray<string> => [
  name,
  ` ${name}`,
  capitalized(name),
  ` ${capitalized(name)}`
]

const promptWords = [
  "user",
  "assistant",
  "system",
  "What",
  " what",
  " colour",
  " color",
  " is",
  " this",
  " the",
  " a",
  " of",
  " in",
  " and",
  " or",
  " it",
  " image",
  " picture",
  " sound",
  " tone",
  " pitch",
  "Is",
  "Paint",
  " paint",
  "Play",
  " play",
  " low",
  " high"
]

/**
 * ChatML, with media parts rendered as their placeholder token. Content may be a string or a list
 * of parts in the OpenAI shape ({type: "text", text}, {type: "image_url"}, {type: "input_audio"}).
 */
const chatTemplate = [
  "{% for message in messages %}",
  `${specialTokens.imStart}{{ message.role }}\n`,
  "{% if message.content is string %}{{ message.content }}",
  "{% else %}{% for part in message.content %}",
  "{% if part.type == 'text' %}{{ part.text }}",
  `{% elif part.type == 'image' or part.type == 'image_url' %}${specialTokens.image}`,
  `{% elif part.type == 'audio' or part.type == 'input_audio' or part.type == 'audio_url' %}${specialTokens.audio}`,
  "{% endif %}",
  "{% endfor %}{% endif %}",
  `${specialTokens.imEnd}\n`,
  "{% endfor %}",
  `{% if add_generation_prompt %}${specialTokens.imStart}assistant\n{% endif %}`
].join("")

export const chatVocabulary = (vocabSize?: number): ByteLevelBpe =>
  byteLevelBpe({
    words: [...answerWords, ...colors.flatMap((color) => colorWordVariants(color.name)), ...promptWords],
    specialTokens: Object.values(specialTokens),
    ...(vocabSize === undefined ? {} : { vocabSize })
  })

/** tokenizer_config.json: the special tokens by role and the chat template. */
export const tokenizerConfig = (vocabulary: ByteLevelBpe, modelMaxLength: number) => ({
  tokenizer_class: "PreTrainedTokenizerFast",
  add_bos_token: false,
  add_eos_token: false,
  bos_token: null,
  eos_token: specialTokens.imEnd,
  pad_token: specialTokens.endOfText,
  unk_token: null,
  clean_up_tokenization_spaces: false,
  model_max_length: modelMaxLength,
  chat_template: chatTemplate,
  added_tokens_decoder: Object.fromEntries(
    Object.values(specialTokens).map((content) => [
      String(vocabulary.tokenId(content)),
      { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }
    ])
  )
})
