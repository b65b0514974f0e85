"""Text files for prepare's tests, made from the demo corpus."""

from bertjax.data import python_docs


def write_topic_files(root):
  """Writes the pydoc topics as one UTF-8 file each (~300 KB) into root.

  Blank lines separate paragraphs. Returns the paragraphs in file order.
  """
  paragraphs = []
  for name, paras in python_docs.topic_documents():
    (root / f"{name.split(':')[1]}.txt").write_text("\n\n".join(paras) + "\n")
    paragraphs.extend(paras)
  return paragraphs
