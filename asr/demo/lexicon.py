"""Words and sentence templates for the synthetic demo corpus (see `asr.demo.synth`).

Ordinary English words that espeak-ng reads well: no abbreviations, no digits, and no
homographs whose pronunciation depends on the part of speech (read, live, tear, wind,
close, lead, minute, ...), so that a transcript says exactly what the audio says.
Everything is lower case here; transcripts are upper-cased when written. `Grammar`, at
the end, turns the lists into sentences (kept here, with the words it draws on).
"""

import random


def _w(text: str) -> list[str]:
    return text.split()


PEOPLE = _w("""
farmer teacher doctor nurse baker butcher painter writer sailor soldier pilot driver
student child boy girl man woman king queen prince princess knight captain merchant
hunter fisherman shepherd miller carpenter gardener singer dancer player stranger
neighbor visitor traveler pupil cousin uncle aunt brother sister mother father daughter
son grandmother grandfather friend guest servant master lady gentleman officer judge
lawyer priest poet artist scientist engineer clerk cook waiter manager banker tailor
porter guard policeman fireman postman mayor widow orphan giant wizard beggar thief
baby husband wife nephew niece partner
""")

ANIMALS = _w("""
dog cat horse cow pig sheep goat chicken duck goose rabbit mouse rat fox wolf bear deer
lion tiger elephant monkey donkey camel zebra giraffe kangaroo snake frog toad turtle
lizard bird eagle owl crow parrot pigeon swan sparrow robin fish whale dolphin shark crab
spider bee butterfly ant beetle worm squirrel hedgehog badger otter beaver ox calf puppy
kitten lamb pony mule hen rooster
""")

THINGS = _w("""
book letter pen pencil paper map key door window table chair bed lamp candle clock
bottle cup glass plate bowl spoon fork knife basket bag box trunk coin ring necklace hat
coat shirt dress shoe boot glove scarf umbrella ticket picture painting mirror blanket
pillow towel rope chain hammer nail ladder bucket wheel cart wagon boat ship car bus
train bicycle truck engine machine radio camera piano guitar drum violin bell whistle
flag ball kite toy doll puzzle game card envelope parcel package newspaper magazine
notebook diary dictionary calendar poster stamp sword shield arrow spear helmet crown
jewel diamond pearl stone rock pebble shell feather flower tulip tree branch leaf seed
apple orange banana lemon pear peach cherry grape melon potato tomato carrot onion
cabbage bean pea cake pie cookie biscuit sandwich egg loaf sausage jar pot pan kettle
teapot oven stove sink shovel spade rake axe brush comb sponge button needle ribbon
purse wallet suitcase compass lantern torch telescope computer telephone keyboard
battery wire pipe tool barrel sack fence gate statue fountain bench swing carpet
curtain sofa cushion drawer shelf cupboard vase medal trophy prize treasure message
story song poem question answer idea plan promise dream problem lesson recipe
photograph note list report candlestick bracelet jacket sweater pocket
handkerchief mitten saddle anchor canoe raft sled paddle net hook
""")

PLACES = _w("""
kitchen garden house cottage castle palace church school library museum hospital
station market shop bakery office factory farm barn stable field forest wood meadow
valley hill mountain river lake pond stream bridge road street lane path village town
city harbor beach island cave tower mill orchard park playground square theater
restaurant hotel inn prison garage attic cellar basement hallway bedroom bathroom
classroom ballroom courtyard yard porch balcony corner kingdom jungle swamp shore coast
ocean sea camp lighthouse temple chapel cathedral zoo circus stadium laboratory
warehouse workshop studio airport canal tunnel cabin
""")

NAMES = _w("""
john mary peter susan james anna thomas emma william alice robert helen george lucy
henry grace charles sarah edward emily david laura michael kate richard jane daniel rose
frank ellen paul martha arthur clara oliver nora simon molly walter betty
""")

ADJECTIVES = _w("""
big small large little tall short long old young new ancient modern happy sad angry
tired hungry thirsty sleepy busy lazy brave clever quiet loud gentle kind cruel proud
shy polite rude friendly lonely lucky careful careless curious famous strange wild calm
warm cold hot cool wet dry clean dirty empty full heavy soft hard smooth rough sharp
bright dark pale red blue green yellow purple brown black white gray golden silver
wooden rusty dusty shiny narrow wide deep shallow thick thin rich poor cheap expensive
beautiful pretty ugly handsome lovely plain fancy simple difficult easy strong weak
quick slow fast early late sweet sour bitter salty fresh rotten ripe delicious noisy
silent peaceful cheerful gloomy foolish wise clumsy graceful eager nervous anxious
patient jealous generous greedy grumpy merry jolly fierce tame dangerous safe hidden
broken tiny huge enormous gigantic splendid magnificent elegant humble grand royal
ordinary special favorite private public distant foreign familiar frozen crowded sunny
cloudy rainy stormy foggy snowy muddy sandy rocky grassy leafy thorny cozy tidy messy
crooked straight round flat steep tender fragile sturdy loyal faithful grateful
mysterious magical terrible wonderful marvelous horrible awful pleasant charming useful
unusual silly serious honest precious valuable
""")

ADVERBS = _w("""
quickly slowly quietly loudly carefully carelessly happily sadly angrily gently softly
suddenly finally eagerly nervously proudly bravely calmly patiently politely rudely
kindly warmly coldly bitterly sweetly brightly clearly easily secretly silently wisely
foolishly cheerfully gladly badly steadily swiftly firmly tightly loosely neatly
together alone again anxiously curiously gracefully gratefully greedily hungrily lazily
merrily noisily peacefully roughly safely seriously smoothly
""")

FREQUENCY = _w("often never always sometimes usually rarely seldom once")

DEGREE = _w("very quite rather really extremely terribly")

# "base/past" pairs. Verbs taking an object.
TRANSITIVE = _w("""
see/saw take/took find/found bring/brought buy/bought sell/sold build/built
carry/carried catch/caught cook/cooked cut/cut draw/drew drink/drank drive/drove
drop/dropped eat/ate feed/fed fill/filled fix/fixed follow/followed forget/forgot
give/gave hide/hid hold/held keep/kept kick/kicked kiss/kissed know/knew lift/lifted
like/liked love/loved meet/met miss/missed move/moved need/needed open/opened
order/ordered paint/painted pick/picked pull/pulled push/pushed reach/reached
remember/remembered repair/repaired ride/rode save/saved send/sent shake/shook
share/shared show/showed steal/stole stop/stopped study/studied teach/taught
throw/threw touch/touched visit/visited want/wanted wash/washed watch/watched
wear/wore win/won wrap/wrapped write/wrote answer/answered ask/asked borrow/borrowed
break/broke burn/burned call/called chase/chased check/checked choose/chose
climb/climbed count/counted cover/covered cross/crossed decorate/decorated
deliver/delivered describe/described destroy/destroyed discover/discovered
enjoy/enjoyed examine/examined explore/explored fold/folded gather/gathered
grab/grabbed greet/greeted guard/guarded help/helped hug/hugged hunt/hunted
invite/invited join/joined lend/lent lose/lost mend/mended notice/noticed pack/packed
pass/passed plant/planted prepare/prepared protect/protected
recognize/recognized rescue/rescued scrub/scrubbed search/searched shut/shut
sketch/sketched smell/smelled squeeze/squeezed stir/stirred sweep/swept test/tested
thank/thanked tie/tied trust/trusted understand/understood weigh/weighed
welcome/welcomed admire/admired blame/blamed boil/boiled bake/baked bury/buried
chew/chewed collect/collected comfort/comforted dig/dug drag/dragged fetch/fetched
hang/hung heat/heated imagine/imagined measure/measured obey/obeyed offer/offered
pour/poured praise/praised print/printed punish/punished roll/rolled rub/rubbed
seize/seized spill/spilled spot/spotted stack/stacked strike/struck tease/teased
trade/traded warn/warned hear/heard bite/bit feel/felt forgive/forgave freeze/froze
grind/ground hire/hired kill/killed marry/married rent/rented
sew/sewed taste/tasted toss/tossed unlock/unlocked unpack/unpacked wipe/wiped
""")

# Verbs without an object.
INTRANSITIVE = _w("""
sleep/slept smile/smiled laugh/laughed cry/cried sing/sang dance/danced run/ran
walk/walked jump/jumped swim/swam wait/waited listen/listened rest/rested sit/sat
stand/stood arrive/arrived fall/fell shout/shouted whisper/whispered wander/wandered
hurry/hurried travel/traveled work/worked play/played speak/spoke talk/talked
agree/agreed appear/appeared disappear/disappeared escape/escaped fly/flew grow/grew
kneel/knelt knock/knocked nod/nodded pray/prayed shiver/shivered sigh/sighed
sneeze/sneezed stumble/stumbled tremble/trembled vanish/vanished wake/woke
yawn/yawned complain/complained breathe/breathed blink/blinked giggle/giggled
hesitate/hesitated rise/rose sail/sailed sink/sank wave/waved wink/winked relax/relaxed
recover/recovered survive/survived begin/began cough/coughed frown/frowned
hide/hid climb/climbed swing/swung stay/stayed
""")

DAYS = _w("monday tuesday wednesday thursday friday saturday sunday")
MONTHS = _w("""
january february march april may june july august september october november december
""")
SEASONS = _w("spring summer autumn winter")
PARTS_OF_DAY = _w("morning afternoon evening night")
MEALS = _w("breakfast lunch dinner supper")
MOMENTS = _w("midnight noon dawn sunset sunrise dusk")
TIME_UNITS = _w("days weeks months years hours")
NUMBERS = _w("""
two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty
""")

PREPOSITIONS = _w("""
in near behind beside across along around inside outside under over through at by
into towards from beyond below above
""")

IRREGULAR_PLURALS = {
    "child": "children", "man": "men", "woman": "women", "fisherman": "fishermen",
    "gentleman": "gentlemen", "policeman": "policemen", "fireman": "firemen",
    "postman": "postmen", "thief": "thieves", "wife": "wives", "knife": "knives",
    "leaf": "leaves", "wolf": "wolves", "shelf": "shelves", "loaf": "loaves",
    "calf": "calves", "scarf": "scarves", "sheep": "sheep", "deer": "deer", "fish": "fish",
    "mouse": "mice", "goose": "geese", "ox": "oxen", "potato": "potatoes",
    "tomato": "tomatoes", "piano": "pianos", "radio": "radios",
    "handkerchief": "handkerchiefs", "canoe": "canoes",
}  # fmt: skip


def plural(noun: str) -> str:
    """English plural of a noun from the lists above."""
    if noun in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[noun]
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _verbs(pairs: list[str], form: int) -> list[str]:
    return list(dict.fromkeys(pair.split("/")[form] for pair in pairs))


_AGENTS = PEOPLE + ANIMALS
_OBJECTS = PEOPLE + ANIMALS + THINGS
CATEGORIES: dict[str, list[str]] = {
    "agent": _AGENTS,
    "agents": [plural(w) for w in _AGENTS],
    "object": _OBJECTS,
    "objects": list(dict.fromkeys(plural(w) for w in _OBJECTS)),
    "place": PLACES,
    "name": NAMES,
    "adj": ADJECTIVES,
    "adv": ADVERBS,
    "freq": FREQUENCY,
    "degree": DEGREE,
    "vt": _verbs(TRANSITIVE, 0),
    "vt_past": _verbs(TRANSITIVE, 1),
    "vi": _verbs(INTRANSITIVE, 0),
    "vi_past": _verbs(INTRANSITIVE, 1),
    "day": DAYS,
    "month": MONTHS,
    "season": SEASONS,
    "part_of_day": PARTS_OF_DAY,
    "meal": MEALS,
    "moment": MOMENTS,
    "unit": TIME_UNITS,
    "number": NUMBERS,
    "prep": PREPOSITIONS,
}
# Subject agreement: "i", "you", "s" (third person singular), "p" (plural).
_BE = {
    "past": {"i": "was", "you": "were", "s": "was", "p": "were"},
    "present": {"i": "am", "you": "are", "s": "is", "p": "are"},
}
_PRONOUNS = {"i": "i", "you": "you", "he": "s", "she": "s", "we": "p", "they": "p"}


def _article(word: str) -> str:
    vowel = word[0] in "aeiou" and not word.startswith(("use", "usu", "uni", "eu", "one"))
    return "an" if vowel else "a"


class Grammar:
    """Seeded sentence templates over CATEGORIES; `sentence()` returns a list of words.

    Each category is drawn from a queue holding a shuffled copy of its list, refilled when
    empty, so every word comes up once per pass through its list. With `known`, categories
    are restricted to those words (a category with none keeps its full list: the caller
    rejects sentences with unknown words).
    """

    def __init__(self, rng: random.Random, known: set[str] | None = None) -> None:
        self.rng = rng
        self.lists: dict[str, list[str]] = {}
        for name, words in CATEGORIES.items():
            self.lists[name] = [w for w in words if known is None or w in known] or words
        self.queues: dict[str, list[str]] = {}

    def w(self, category: str) -> str:
        if not self.queues.get(category):
            words = self.lists[category]
            self.queues[category] = self.rng.sample(words, k=len(words))
        return self.queues[category].pop()

    def p(self, probability: float) -> bool:
        return self.rng.random() < probability

    def pick(self, options: str) -> list[str]:
        """One of the "|"-separated options, as words."""
        return self.rng.choice(options.split("|")).split()

    def noun_phrase(
        self, singular: str, plural: str = "", p_plural: float = 0.0
    ) -> tuple[list[str], str]:
        """(words, agreement) for a determiner, 0-2 adjectives and a noun."""
        adjs = [self.w("adj") for _ in range(self.p(0.45) + self.p(0.12))]
        if plural and self.p(p_plural):
            det = [self.w("number")] if self.p(0.3) else self.pick(_PLURAL_DETERMINERS)
            return [*det, *adjs, self.w(plural)], "p"
        det = self.pick("the|the|the|a|a|this|that|every|my|your|his|her|our")
        noun = self.w(singular)
        if det == ["a"]:
            det = [_article((adjs or [noun])[0])]
        return [*det, *adjs, noun], "s"

    def subject(self) -> tuple[list[str], str]:
        r = self.rng.random()
        if r < 0.18:
            pronoun = self.rng.choice(list(_PRONOUNS))
            return [pronoun], _PRONOUNS[pronoun]
        if r < 0.25:
            return [self.w("name")], "s"
        if r < 0.28:
            return [self.w("name"), "and", self.w("name")], "p"
        return self.noun_phrase("agent", "agents", 0.25)

    def object(self) -> list[str]:
        r = self.rng.random()
        if r < 0.07:
            return self.pick("him|her|them|us|me|it")
        if r < 0.12:
            owner = [self.w("name")] if self.p(0.5) else ["the", self.w("agent")]
            return [*owner[:-1], f"{owner[-1]}'s", self.w("object")]
        return self.noun_phrase("object", "objects", 0.35)[0]

    def time(self) -> list[str]:
        kind = self.rng.randrange(8)
        if kind == 0:
            return self.pick("yesterday|today|tonight|tomorrow|later|then")
        if kind == 1:
            return ["on", self.w("day"), *([self.w("part_of_day")] if self.p(0.4) else [])]
        if kind == 2:
            return [*self.pick("in|early in|late in|last|every"), self.w("month")]
        if kind == 3:
            return [*self.pick("in the|last|every|that|all"), self.w("season")]
        if kind == 4:
            return [*self.pick("in the|this|every|one|that"), self.w("part_of_day")]
        if kind == 5:
            return [*self.pick("after|before|during"), self.w("meal")]
        if kind == 6:
            return ["at", self.w("moment")]
        return [self.w("number"), self.w("unit"), "ago"]

    def extras(self, p_place: float, p_adverb: float, p_time: float) -> list[str]:
        """Optional place phrase, adverb and time phrase, in that order."""
        words = [self.w("prep"), *self.noun_phrase("place")[0]] if self.p(p_place) else []
        words += [self.w("adv")] if self.p(p_adverb) else []
        return words + (self.time() if self.p(p_time) else [])

    def predicate(self, form: str) -> list[str]:
        """A verb (form "" = base, "_past") with its object, if transitive, and extras."""
        if self.p(0.35):
            return [self.w("vi" + form), *self.extras(0.55, 0.4, 0.25)]
        return [self.w("vt" + form), *self.object(), *self.extras(0.45, 0.2, 0.2)]

    def clause(self) -> list[str]:
        subj, agreement = self.subject()
        kind = self.rng.random()
        if kind < 0.5:
            freq = [self.w("freq")] if self.p(0.12) else []
            return [*subj, *freq, *self.predicate("_past")]
        if kind < 0.62:
            modal = self.pick("will|can|could|should|must|might|would|will not|cannot")
            return [*subj, *modal, *self.predicate("")]
        if kind < 0.72:
            return [*subj, *self.pick("didn't|couldn't|wouldn't|won't|can't"), *self.predicate("")]
        if kind < 0.86:
            be = _BE[self.rng.choice(("past", "past", "present"))][agreement]
            degree = [self.w("degree")] if self.p(0.35) else []
            return [*subj, be, *degree, self.w("adj"), *self.extras(0.3, 0.0, 0.2)]
        verb = self.pick("wanted|tried|decided|hoped|forgot|promised|refused|needed")
        return [*subj, *verb, "to", *self.predicate("")]

    def question(self) -> list[str]:
        kind = self.rng.randrange(5)
        if kind == 0:
            return [*self.pick("did|where did|when did|why did|how did"), *self.clause_base()]
        if kind == 1:
            return ["who", *self.predicate("_past")]
        if kind == 2:
            return ["what", "did", *self.subject()[0], self.w("vt"), *self.extras(0.5, 0.0, 0.2)]
        if kind == 3:
            subj, agreement = self.subject()
            degree = [self.w("degree")] if self.p(0.3) else []
            be = _BE[self.rng.choice(("past", "present"))][agreement]
            return [be, *subj, *degree, self.w("adj"), *self.extras(0.2, 0.0, 0.2)]
        return [*self.pick("can|will|should|could|would"), *self.clause_base()]

    def clause_base(self) -> list[str]:
        return [*self.subject()[0], *self.predicate("")]

    def sentence(self) -> list[str]:
        r = self.rng.random()
        if r < 0.38:
            return self.clause()
        if r < 0.62:
            conj = self.pick("and|but|so|because|while|when|after|before|although|until")
            return [*self.clause(), *conj, *self.clause()]
        if r < 0.77:
            return self.question()
        if r < 0.84:
            verb = self.pick("said|thought|knew|believed|hoped|explained|noticed")
            return [*self.subject()[0], *verb, "that", *self.clause()]
        if r < 0.92:
            return [*self.pick("please|please|don't|let's|never"), *self.predicate("")]
        noun, agreement = self.noun_phrase("object", "objects", 0.35)
        be = _BE["past"][agreement]
        place = [self.w("prep"), *self.noun_phrase("place")[0]]
        return ["there", be, *noun, *place, *self.extras(0.0, 0.0, 0.3)]


_PLURAL_DETERMINERS = "the|the|some|many|several|these|those|my|our|their|his|her"
