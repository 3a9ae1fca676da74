/**
 * A small uncased WordPiece vocabulary in BERT's layout, for the constructed text embedding models:
 * [PAD] 0, [unused0..98], [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then every ASCII letter,
 * digit and punctuation mark alone and as a word piece (`##a`), common suffixes, and common English
 * words whole. Any text tokenizes (an unknown word falls into its characters), as with BERT's own
 * vocabulary, only into more pieces.
 */

export const wordPieceSpecialTokens = {
  pad: "[PAD]",
  unknown: "[UNK]",
  cls: "[CLS]",
  sep: "[SEP]",
  mask: "[MASK]"
} as const

const characters = [..."!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", ..."0123456789", ..."abcdefghijklmnopqrstuvwxyz"]

const suffixes = "s es ed ing ly er ers est tion tions ment ness al ful able ity ize ous ive"

const words = `the of and to a in is it you that he was for on are with as his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do their time if
will way about many then them write would like so these her long make thing see him two has look more day could go come
did number sound no most people my over know water than call first who may down side been now find any new work part
take get place made live where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move right boy old too same
tell does set three want air well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again animal point mother world
near build self earth father head stand own page should country found answer school grow study still learn plant cover
food sun four between state keep eye never last let thought city tree cross farm hard start might story saw far sea draw
left late run while press close night real life few north open seem together next white children begin got walk example
ease paper group always music those both mark often letter until mile river car feet care second book carry took science
eat room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave song measure door
product black short numeral class wind question happen complete ship area half rock order fire south problem piece told
knew pass since top whole king space heard best hour better true during hundred five remember step early hold west ground
interest reach fast verb sing listen six table travel less morning ten simple several toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit power town fine certain fly
fall lead cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive stood
contain front teach week final gave green quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide surface deep moon island foot
system busy test record boat common gold possible plane dry wonder laugh thousand ago ran check game shape equate hot miss
brought heat snow tire bring yes distant fill east paint language among document search query vector embedding model
retrieval text data cat dogs cats weather today tomorrow computer network server serving platform app apps`

/** The vocabulary in id order. */
export const wordPieceVocabulary = (): ReadonlyArray<string> => {
  const tokens = [
    wordPieceSpecialTokens.pad,
    ...Array.from({ length: 99 }, (_, index) => `[unused${index}]`),
    wordPieceSpecialTokens.unknown,
    wordPieceSpecialTokens.cls,
    wordPieceSpecialTokens.sep,
    wordPieceSpecialTokens.mask,
    ...characters,
    ...characters.map((character) => `##${character}`),
    ...suffixes.split(" ").map((suffix) => `##${suffix}`),
    ...words.split(/\s+/)
  ]
  return [...new Set(tokens)]
}

/** tokenizer.json of BERT's uncased fast tokenizer over `vocabulary`. */
export const wordPieceTokenizerJson = (vocabulary: ReadonlyArray<string>) => {
  const idOf = (token: string) => vocabulary.indexOf(token)
  const special = (token: string) => ({ SpecialToken: { id: token, type_id: 0 } })
  const { pad, unknown, cls, sep, mask } = wordPieceSpecialTokens
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [pad, unknown, cls, sep, mask].map((content) => ({
      id: idOf(content),
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true
    })),
    normalizer: {
      type: "BertNormalizer",
      clean_text: true,
      handle_chinese_chars: true,
      strip_accents: null,
      lowercase: true
    },
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: {
      type: "TemplateProcessing",
      single: [special(cls), { Sequence: { id: "A", type_id: 0 } }, special(sep)],
      pair: [
        special(cls),
        { Sequence: { id: "A", type_id: 0 } },
        special(sep),
        { Sequence: { id: "B", type_id: 1 } },
        { SpecialToken: { id: sep, type_id: 1 } }
      ],
      special_tokens: Object.fromEntries(
        [cls, sep].map((token) => [token, { id: token, ids: [idOf(token)], tokens: [token] }])
      )
    },
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: {
      type: "WordPiece",
      unk_token: unknown,
      continuing_subword_prefix: "##",
      max_input_chars_per_word: 100,
      vocab: Object.fromEntries(vocabulary.map((token, id) => [token, id]))
    }
  }
}

/** tokenizer_config.json of BERT's uncased tokenizer. */
export const wordPieceTokenizerConfig = (modelMaxLength: number) => ({
  tokenizer_class: "BertTokenizer",
  do_lower_case: true,
  tokenize_chinese_chars: true,
  strip_accents: null,
  clean_up_tokenization_spaces: true,
  model_max_length: modelMaxLength,
  cls_token: wordPieceSpecialTokens.cls,
  sep_token: wordPieceSpecialTokens.sep,
  pad_token: wordPieceSpecialTokens.pad,
  unk_token: wordPieceSpecialTokens.unknown,
  mask_token: wordPieceSpecialTokens.mask
})
