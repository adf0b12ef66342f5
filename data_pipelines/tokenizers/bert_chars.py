"""Character classes of HF BERT basic tokenization, as RE2 classes for in-graph (TF) use.

`transformers.BertTokenizer` (the parity reference) runs the Rust `tokenizers` BertNormalizer and
BertPreTokenizer. Their character tables are NOT today's Unicode, and not what RE2's \\p{..} or ICU
(inside tf_text) use:
  * control/format/private-use ("remove") and punctuation and non-spacing-mark tables come from the
    `unicode_categories` crate (Unicode 8-9 era): e.g. U+2E43..U+2E5D are punctuation in Python and
    RE2 but not in HF; U+166D (So today, Po in old Unicode) is punctuation in HF. Unassigned code
    points (Cn) are kept, not removed.
  * CJK ranges have a typo: U+2B920..U+2CEAF instead of U+2B820 (so Ext-E U+2B820..U+2B91F is not
    split out like other ideographs).
  * lower-casing is Rust's per-character `char::to_lowercase` (Unicode 16 in tokenizers 0.23.3):
    no final-sigma rule (ICU maps a word-final 'Σ' to 'ς', HF to 'σ') and a few dozen newer letters
    that TF's ICU lower-casing does not know.
So the tables below were probed from the reference over all 1,112,064 code points (see `main`),
which makes the in-graph tokenizer id-identical to HF for every single character, and
tests/data_pipelines/tokenizers/tokenization_test.py re-checks every code point against the installed `tokenizers`.

Regenerate after upgrading `tokenizers` or TF (prints the constants to paste below):
  python -m data_pipelines.tokenizers.bert_chars
"""

# Hex code-point ranges "a-b" (or single "a"), space separated.
# Removed by clean_text: NUL, U+FFFD and old-Unicode Cc/Cf/Co/Cs (but not \t \n \r).
REMOVE = (
    "0-8 B-C E-1F 7F-9F AD 600-605 61C 6DD 70F 180E 200B-200F 202A-202E 2060-2064 2066-206F "
    "E000-F8FF FEFF FFF9-FFFB FFFD 110BD 1BCA0-1BCA3 1D173-1D17A E0001 E0020-E007F F0000-FFFFD "
    "100000-10FFFD ")
# Turned into " " by clean_text: \t \n \r and the White_Space property, minus " " itself.
SPACE = (
    "9-A D A0 1680 2000-200A 2028-2029 202F 205F 3000 ")
# Surrounded by spaces (each ideograph is its own word).
CJK = (
    "3400-4DBF 4E00-9FFF F900-FAFF 20000-2A6DF 2A700-2B81F 2B920-2CEAF 2F800-2FA1F ")
# Each is its own word (BertPreTokenizer): ASCII symbols and old-Unicode P* categories.
PUNCT = (
    "21-2F 3A-40 5B-60 7B-7E A1 A7 AB B6-B7 BB BF 37E 387 55A-55F 589-58A 5BE 5C0 5C3 5C6 "
    "5F3-5F4 609-60A 60C-60D 61B 61E-61F 66A-66D 6D4 700-70D 7F7-7F9 830-83E 85E 964-965 970 "
    "AF0 DF4 E4F E5A-E5B F04-F12 F14 F3A-F3D F85 FD0-FD4 FD9-FDA 104A-104F 10FB 1360-1368 1400 "
    "166D-166E 169B-169C 16EB-16ED 1735-1736 17D4-17D6 17D8-17DA 1800-180A 1944-1945 1A1E-1A1F "
    "1AA0-1AA6 1AA8-1AAD 1B5A-1B60 1BFC-1BFF 1C3B-1C3F 1C7E-1C7F 1CC0-1CC7 1CD3 2010-2027 "
    "2030-2043 2045-2051 2053-205E 207D-207E 208D-208E 2308-230B 2329-232A 2768-2775 27C5-27C6 "
    "27E6-27EF 2983-2998 29D8-29DB 29FC-29FD 2CF9-2CFC 2CFE-2CFF 2D70 2E00-2E2E 2E30-2E42 "
    "3001-3003 3008-3011 3014-301F 3030 303D 30A0 30FB A4FE-A4FF A60D-A60F A673 A67E A6F2-A6F7 "
    "A874-A877 A8CE-A8CF A8F8-A8FA A8FC A92E-A92F A95F A9C1-A9CD A9DE-A9DF AA5C-AA5F AADE-AADF "
    "AAF0-AAF1 ABEB FD3E-FD3F FE10-FE19 FE30-FE52 FE54-FE61 FE63 FE68 FE6A-FE6B FF01-FF03 "
    "FF05-FF0A FF0C-FF0F FF1A-FF1B FF1F-FF20 FF3B-FF3D FF3F FF5B FF5D FF5F-FF65 10100-10102 "
    "1039F 103D0 1056F 10857 1091F 1093F 10A50-10A58 10A7F 10AF0-10AF6 10B39-10B3F 10B99-10B9C "
    "11047-1104D 110BB-110BC 110BE-110C1 11140-11143 11174-11175 111C5-111C9 111CD 111DB "
    "111DD-111DF 11238-1123D 112A9 114C6 115C1-115D7 11641-11643 1173C-1173E 12470-12474 "
    "16A6E-16A6F 16AF5 16B37-16B3B 16B44 1BC9F 1DA87-1DA8B ")
# Stripped in uncased mode after NFD (old-Unicode Mn).
MARK = (
    "300-33F 342 345-36F 483-487 591-5BD 5BF 5C1-5C2 5C4-5C5 5C7 610-61A 64B-65F 670 6D6-6DC "
    "6DF-6E4 6E7-6E8 6EA-6ED 711 730-74A 7A6-7B0 7EB-7F3 816-819 81B-823 825-827 829-82D "
    "859-85B 8E3-902 93A 93C 941-948 94D 951-957 962-963 981 9BC 9C1-9C4 9CD 9E2-9E3 A01-A02 "
    "A3C A41-A42 A47-A48 A4B-A4D A51 A70-A71 A75 A81-A82 ABC AC1-AC5 AC7-AC8 ACD AE2-AE3 B01 "
    "B3C B3F B41-B44 B4D B56 B62-B63 B82 BC0 BCD C00 C3E-C40 C46-C47 C4A-C4D C55-C56 C62-C63 "
    "C81 CBC CBF CC6 CCC-CCD CE2-CE3 D01 D41-D44 D4D D62-D63 DCA DD2-DD4 DD6 E31 E34-E3A "
    "E47-E4E EB1 EB4-EB9 EBB-EBC EC8-ECD F18-F19 F35 F37 F39 F71-F72 F74 F77 F79-F7E F80 "
    "F82-F84 F86-F87 F8D-F92 F94-F97 F99-F9C F9E-FA1 FA3-FA6 FA8-FAB FAD-FB8 FBA-FBC FC6 "
    "102D-1030 1032-1037 1039-103A 103D-103E 1058-1059 105E-1060 1071-1074 1082 1085-1086 108D "
    "109D 135D-135F 1712-1714 1732-1734 1752-1753 1772-1773 17B4-17B5 17B7-17BD 17C6 17C9-17D3 "
    "17DD 180B-180D 18A9 1920-1922 1927-1928 1932 1939-193B 1A17-1A18 1A1B 1A56 1A58-1A5E 1A60 "
    "1A62 1A65-1A6C 1A73-1A7C 1A7F 1AB0-1ABD 1B00-1B03 1B34 1B36-1B3A 1B3C 1B42 1B6B-1B73 "
    "1B80-1B81 1BA2-1BA5 1BA8-1BA9 1BAB-1BAD 1BE6 1BE8-1BE9 1BED 1BEF-1BF1 1C2C-1C33 1C36-1C37 "
    "1CD0-1CD2 1CD4-1CE0 1CE2-1CE8 1CED 1CF4 1CF8-1CF9 1DC0-1DF5 1DFC-1DFF 20D0-20DC 20E1 "
    "20E5-20F0 2CEF-2CF1 2D7F 2DE0-2DFF 302A-302D 3099-309A A66F A674-A67D A69E-A69F A6F0-A6F1 "
    "A802 A806 A80B A825-A826 A8C4 A8E0-A8F1 A926-A92D A947-A951 A980-A982 A9B3 A9B6-A9B9 A9BC "
    "A9E5 AA29-AA2E AA31-AA32 AA35-AA36 AA43 AA4C AA7C AAB0 AAB2-AAB4 AAB7-AAB8 AABE-AABF AAC1 "
    "AAEC-AAED AAF6 ABE5 ABE8 ABED FB1E FE00-FE0F FE20-FE2F 101FD 102E0 10376-1037A 10A01-10A03 "
    "10A05-10A06 10A0C-10A0F 10A38-10A3A 10A3F 10AE5-10AE6 11001 11038-11046 1107F-11081 "
    "110B3-110B6 110B9-110BA 11100-11102 11127-1112B 1112D 11130-11134 11173 11180-11181 "
    "111B6-111BE 111CA-111CC 1122F-11231 11234 11236-11237 112DF 112E3-112EA 11300-11301 1133C "
    "11340 11366-1136C 11370-11374 114B3-114B8 114BA 114BF-114C0 114C2-114C3 115B2-115B5 "
    "115BC-115BD 115BF-115C0 115DC-115DD 11633-1163A 1163D 1163F-11640 116AB 116AD 116B0-116B5 "
    "116B7 1171D-1171F 11722-11725 11727-1172B 16AF0-16AF4 16B30-16B36 16F8F-16F92 1BC9D-1BC9E "
    "1D167-1D169 1D17B-1D182 1D185-1D18B 1D1AA-1D1AD 1D242-1D244 1DA00-1DA36 1DA3B-1DA6C 1DA75 "
    "1DA84 1DA9B-1DA9F 1DAA1-1DAAF 1E8D0-1E8D6 E0100-E01EF ")
# Uncased mode only: code points where NFD (ICU) + MARK strip + TF lower-casing differ from HF;
# "a:b" maps code point a to b.
UNCASED_FIXES = (
    "1C89:1C8A 2C2F:2C5F A7C0:A7C1 A7CB:264 A7CC:A7CD A7CE:A7CF A7D0:A7D1 A7D2:A7D3 A7D4:A7D5 "
    "A7D6:A7D7 A7D8:A7D9 A7DA:A7DB A7DC:19B 10570:10597 10571:10598 10572:10599 10573:1059A "
    "10574:1059B 10575:1059C 10576:1059D 10577:1059E 10578:1059F 10579:105A0 1057A:105A1 "
    "1057C:105A3 1057D:105A4 1057E:105A5 1057F:105A6 10580:105A7 10581:105A8 10582:105A9 "
    "10583:105AA 10584:105AB 10585:105AC 10586:105AD 10587:105AE 10588:105AF 10589:105B0 "
    "1058A:105B1 1058C:105B3 1058D:105B4 1058E:105B5 1058F:105B6 10590:105B7 10591:105B8 "
    "10592:105B9 10594:105BB 10595:105BC 105C9:105C9 105E4:105E4 10D50:10D70 10D51:10D71 "
    "10D52:10D72 10D53:10D73 10D54:10D74 10D55:10D75 10D56:10D76 10D57:10D77 10D58:10D78 "
    "10D59:10D79 10D5A:10D7A 10D5B:10D7B 10D5C:10D7C 10D5D:10D7D 10D5E:10D7E 10D5F:10D7F "
    "10D60:10D80 10D61:10D81 10D62:10D82 10D63:10D83 10D64:10D84 10D65:10D85 11383:11383 "
    "11385:11385 1138E:1138E 11391:11391 113C5:113C5 113C7:113C7 113C8:113C8 11938:11938 "
    "16121:16121 16122:16122 16123:16123 16124:16124 16125:16125 16126:16126 16127:16127 "
    "16128:16128 16D68:16D68 16D69:16D69 16D6A:16D6A 16EA0:16EBB 16EA1:16EBC 16EA2:16EBD "
    "16EA3:16EBE 16EA4:16EBF 16EA5:16EC0 16EA6:16EC1 16EA7:16EC2 16EA8:16EC3 16EA9:16EC4 "
    "16EAA:16EC5 16EAB:16EC6 16EAC:16EC7 16EAD:16EC8 16EAE:16EC9 16EAF:16ECA 16EB0:16ECB "
    "16EB1:16ECC 16EB2:16ECD 16EB3:16ECE 16EB4:16ECF 16EB5:16ED0 16EB6:16ED1 16EB7:16ED2 "
    "16EB8:16ED3 ")


def parse_ranges(spec):
  """'41-5A 61' -> [(0x41, 0x5A), (0x61, 0x61)]."""
  out = []
  for item in spec.split():
    a, _, b = item.partition("-")
    out.append((int(a, 16), int(b or a, 16)))
  return out


def re2_class(spec):
  """Ranges -> an RE2 character class such as [\\x{41}-\\x{5A}\\x{61}]."""
  parts = [f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}"
           for a, b in parse_ranges(spec)]
  return "[" + "".join(parts) + "]"


def complement(cps):
  """Code points -> range spec of every code point NOT in `cps` (within 0..U+10FFFF)."""
  out, start = [], 0
  for cp in sorted(set(cps)) + [0x110000]:
    if cp > start:
      out.append(f"{start:X}-{cp - 1:X}" if cp - 1 > start else f"{start:X}")
    start = cp + 1
  return " ".join(out)


def parse_fixes(spec):
  """'A7C0:A7C1 ...' -> {0xA7C0: 0xA7C1, ...}."""
  return {int(a, 16): int(b, 16) for a, b in (item.split(":") for item in spec.split())}


def _to_ranges(cps):
  cps = sorted(cps)
  ranges = []
  for cp in cps:
    if ranges and ranges[-1][1] == cp - 1:
      ranges[-1][1] = cp
    else:
      ranges.append([cp, cp])
  return " ".join(f"{a:X}" if a == b else f"{a:X}-{b:X}" for a, b in ranges)


def _wrap(name, spec):
  lines, line = [], ""
  for item in spec.split():
    if len(line) + len(item) + 1 > 90:
      lines.append(line)
      line = ""
    line = f"{line} {item}" if line else item
  lines.append(line)
  body = "\n".join(f"    \"{l} \"" for l in lines)
  return f"{name} = (\n{body})\n"


def probe():
  """Probes the reference (tokenizers) and TF over all code points; returns the table specs."""
  import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top
  from tokenizers import normalizers, pre_tokenizers  # test-only dependency
  from bert_jax_core.tf_setup import tf

  cased = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                     strip_accents=None, lowercase=False)
  uncased = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                       strip_accents=None, lowercase=True)
  strip = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                     strip_accents=True, lowercase=False)
  nfd = normalizers.NFD()
  pre = pre_tokenizers.BertPreTokenizer()
  cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]  # surrogates: not in UTF-8
  remove, space, cjk, punct, mark, plain = [], [], [], [], [], []
  for cp in cps:
    c = chr(cp)
    out = cased.normalize_str(c)
    if out == "":
      remove.append(cp)
    elif out == " ":
      if c != " ":
        space.append(cp)
    elif out == f" {c} ":
      cjk.append(cp)
    elif out != c:
      raise AssertionError(f"unexpected cased normalization of U+{cp:04X}: {out!r}")
    else:
      plain.append(cp)
      words = [w for w, _ in pre.pre_tokenize_str(f"a{c}b")]
      if words == ["a", c, "b"]:
        punct.append(cp)
      elif words != [f"a{c}b"]:
        raise AssertionError(f"unexpected pre-tokenization of U+{cp:04X}: {words}")
      if nfd.normalize_str(c) == c and strip.normalize_str(c) == "":
        mark.append(cp)
  # Uncased: what our TF ops give per character versus HF.
  spec = dict(REMOVE=_to_ranges(remove), SPACE=_to_ranges(space), CJK=_to_ranges(cjk),
              PUNCT=_to_ranges(punct), MARK=_to_ranges(mark))
  chars = [chr(cp) for cp in plain]
  x = tf.constant([c.encode("utf-8") for c in chars])
  x = tf_text.normalize_utf8(x, "NFD")
  x = tf.strings.regex_replace(x, re2_class(spec["MARK"]), "")
  # (Word-final 'Σ' differs only in context, so tokenization.py adds it to the fixes itself.)
  ours = [s.decode("utf-8") for s in tf.strings.lower(x, encoding="utf-8").numpy()]
  fixes = []
  for c, o in zip(chars, ours):
    ref = uncased.normalize_str(c)
    if ref != o:
      if len(ref) != 1:  # the in-graph fix maps one code point to one
        raise AssertionError(f"U+{ord(c):04X}: HF gives {ref!r}, not one character")
      fixes.append(f"{ord(c):X}:{ord(ref):X}")
  spec["UNCASED_FIXES"] = " ".join(fixes)
  return spec


def main():
  for name, value in probe().items():
    print(_wrap(name, value))


if __name__ == "__main__":
  main()
